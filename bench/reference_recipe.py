"""The diffusers `train_unconditional` recipe, re-implemented on the same data, for equal-compute comparisons.

    .venv/bin/python bench/reference_recipe.py --output-dir runs/ref --minutes 60

What the diffusers example script does by default (read from its argument defaults), not copied:
UNet2DModel with attention blocks at the chosen resolutions, DDPMScheduler (1000 steps, linear
betas, epsilon prediction), AdamW lr 1e-4, betas (0.95, 0.999), weight decay 1e-6, eps 1e-8, cosine LR
schedule with 500 warm-up steps over 100 epochs, batch 16, grad-norm clipping at 1.0, EMA
(EMAModel, warm-up inv_gamma 1.0, power 3/4, max decay 0.9999), random horizontal flips, fp32,
plain MSE loss. Data and validation split come from denoiser's loaders so both recipes see the same
images. The EMA weights are exported as a DDPMPipeline.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from diffusers import DDPMScheduler, UNet2DModel
from diffusers.optimization import get_scheduler
from diffusers.training_utils import EMAModel
from tqdm.auto import tqdm

from denoiser.data import load_datasets
from denoiser.sampling.pipeline import save_pipeline
from denoiser.train.config import DataConfig


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--output-dir", required=True)
    p.add_argument("--data", default="../shared/data/cifar10-jpeg/train")
    p.add_argument("--val-size", type=int, default=1000)
    p.add_argument("--val-seed", type=int, default=0)
    p.add_argument("--minutes", type=float, required=True, help="wall-clock training budget")
    p.add_argument("--block-out-channels", type=int, nargs="+", default=[32, 64, 64])
    p.add_argument("--attention-levels", type=int, nargs="+", default=[1, 2], help="levels with attention (0 = full res)")
    p.add_argument("--attention-head-dim", type=int, default=16)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--epochs", type=int, default=100, help="only sets the cosine schedule's length, as in the script")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()

    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(args.seed)
    n = len(args.block_out_channels)
    down = tuple("AttnDownBlock2D" if i in args.attention_levels else "DownBlock2D" for i in range(n))
    up = tuple(reversed([b.replace("Down", "Up") for b in down]))
    unet = UNet2DModel(sample_size=32, in_channels=3, out_channels=3, layers_per_block=2,
                       block_out_channels=tuple(args.block_out_channels), down_block_types=down, up_block_types=up,
                       attention_head_dim=args.attention_head_dim)
    train_ds, _ = load_datasets(DataConfig(dataset="folder", path=args.data, val_size=args.val_size,
                                           val_seed=args.val_seed), 32)
    scheduler = DDPMScheduler(num_train_timesteps=1000, beta_schedule="linear", prediction_type="epsilon")
    opt = torch.optim.AdamW(unet.parameters(), lr=1e-4, betas=(0.95, 0.999), weight_decay=1e-6, eps=1e-8)
    steps_per_epoch = len(train_ds) // args.batch_size
    lr_sched = get_scheduler("cosine", opt, num_warmup_steps=500, num_training_steps=args.epochs * steps_per_epoch)
    ema = EMAModel(unet.parameters(), decay=0.9999, use_ema_warmup=True, inv_gamma=1.0, power=3 / 4,
                   model_cls=UNet2DModel, model_config=unet.config)
    gen = torch.Generator().manual_seed(args.seed)
    started, step, log = time.monotonic(), 0, []
    bar = tqdm(desc="reference", unit="step")
    while time.monotonic() - started < 60 * args.minutes:
        idx = torch.randint(0, len(train_ds), (args.batch_size,), generator=gen)
        x0, _ = train_ds.batch(idx)
        x0 = torch.where(torch.rand(args.batch_size, 1, 1, 1, generator=gen) < 0.5, x0.flip(-1), x0)
        noise = torch.randn(x0.shape, generator=gen)
        t = torch.randint(0, 1000, (args.batch_size,), generator=gen)
        pred = unet(scheduler.add_noise(x0, noise, t), t).sample
        loss = F.mse_loss(pred, noise)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(unet.parameters(), 1.0)
        opt.step()
        lr_sched.step()
        opt.zero_grad(set_to_none=True)
        ema.step(unet.parameters())
        step += 1
        log.append(float(loss))
        bar.update(1)
        bar.set_postfix(loss=f"{float(loss):.4f}", refresh=False)
    bar.close()
    ema.copy_to(unet.parameters())
    save_pipeline(unet.eval(), scheduler, out / "model")
    summary = {"steps": step, "images_seen": step * args.batch_size, "minutes": args.minutes,
               "params": sum(p.numel() for p in unet.parameters()), "final_lr": lr_sched.get_last_lr()[0],
               "mean_loss_last_100": sum(log[-100:]) / max(1, len(log[-100:]))}
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    print(json.dumps(summary))


if __name__ == "__main__":
    main()

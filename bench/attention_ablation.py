"""Which attention layers matter, at which noise levels: held-out ε-MSE with each layer switched to identity.

    OMP_NUM_THREADS=1 .venv/bin/python -m bench.attention_ablation --model weights/cifar10 --num-images 100

On validation images the model never trained on (the 5,000-image split, seed 0), each timestep t noises
them with seeded noise; the UNet predicts ε plain, with each attention layer switched to the identity
(`identity_attention`: each pixel attends only to itself), and with all of them switched. The table gives
the MSE against the true ε and how much each switch raises it; `denoiser attention-stats` on the same
images gives the per-layer distances, entropies and charts (written next to the table). FID with layers
switched off: `python -m bench.guidance_table run --settings off@LAYER ...`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from denoiser.data import load_datasets
from denoiser.diffusion import Diffusion
from denoiser.evaluate.attention_stats import attention_stats, stats_chart, write_csv
from denoiser.folders.model_dir import load_model
from denoiser.model.attention import attention_layer_names
from denoiser.model.attention_blocks import identity_attention
from denoiser.train.config import DataConfig

TIMESTEPS = (999, 800, 600, 400, 250, 100, 30, 5)
DATA = {"cifar10": "../shared/data/cifar10-jpeg/train", "emoji": "../shared/data/emoji"}
VAL = {"cifar10": (5000, 0), "emoji": (500, 0)}


@torch.inference_mode()
def all_off_mse(unet, sched, x, labels, timesteps, seed: int = 0) -> dict[int, tuple[float, float]]:
    """(plain MSE, MSE with every attention layer switched) per timestep, the same seeded noise as attention_stats."""
    diffusion = Diffusion(sched)
    generator = torch.Generator().manual_seed(seed)
    out = {}
    for t in timesteps:
        noise = torch.randn(x.shape, generator=generator)
        t_b = torch.full((x.shape[0],), t, dtype=torch.long)
        x_t = diffusion.add_noise(x, noise, t_b)
        plain = diffusion.predict_eps(x_t, unet(x_t, t_b, class_labels=labels).sample, t_b)
        with identity_attention(unet):
            off = diffusion.predict_eps(x_t, unet(x_t, t_b, class_labels=labels).sample, t_b)
        out[t] = (float((plain - noise).pow(2).mean()), float((off - noise).pow(2).mean()))
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True)
    p.add_argument("--num-images", type=int, default=100)
    args = p.parse_args()
    name = Path(args.model).name
    unet, sched = load_model(args.model)
    val_size, val_seed = VAL[name]
    _, val = load_datasets(DataConfig(dataset="folder", path=DATA[name], val_size=val_size, val_seed=val_seed),
                           unet.config.sample_size)
    x, labels = val.batch(torch.arange(args.num_images))
    rows = attention_stats(unet, sched, x, labels, TIMESTEPS, heads=False)
    totals = all_off_mse(unet, sched, x, labels, TIMESTEPS)
    out = Path("bench") / f"attention_ablation_{name}"
    write_csv(rows, out.with_suffix(".csv"))
    stats_chart(rows).save(Path("docs") / f"attention-stats-{name}.png")
    head = "| layer | grid | " + " | ".join(f"t={t}" for t in TIMESTEPS) + " |"
    lines = [head, "|---|---|" + "---|" * len(TIMESTEPS)]
    lines.append("| ε-MSE, plain | | " + " | ".join(f"{totals[t][0]:.4f}" for t in TIMESTEPS) + " |")
    for layer in attention_layer_names(unet):
        rs = {r.timestep: r for r in rows if r.layer == layer}
        lines.append(f"| {layer} | {rs[TIMESTEPS[0]].resolution}² | "
                     + " | ".join(f"{100 * rs[t].eps_mse_delta / totals[t][0]:+.1f}%" for t in TIMESTEPS) + " |")
    lines.append("| **all layers** | | " + " | ".join(f"**{100 * (totals[t][1] / totals[t][0] - 1):+.1f}%**" for t in TIMESTEPS)
                 + " |")
    md = (f"## Attention ablation on `{name}`: held-out ε-MSE with layers switched to identity\n\n"
          f"{args.num_images} validation images (split {val_size}, seed {val_seed}) with their classes, seeded noise "
          f"per timestep; each cell is how much switching that layer (all its heads) to identity attention raises the "
          f"ε-MSE, relative to the plain model. Command: `{' '.join(['python -m bench.attention_ablation'] + sys.argv[1:])}`. Per-layer statistics: "
          f"`{out.with_suffix('.csv')}`, charts `docs/attention-stats-{name}.png`.\n\n" + "\n".join(lines) + "\n")
    out.with_suffix(".md").write_text(md)
    print(md)


if __name__ == "__main__":
    main()

"""Equal-compute comparison: denoiser's recipe vs the diffusers train_unconditional recipe, same held-out images.

    .venv/bin/python bench/compare_recipes.py --ours runs/cifar10-cpu --reference runs/ref-cifar10 \
        --num-images 500 --num-timesteps 100 --out bench/recipe_comparison.md

Both models are evaluated by the same code (`Diffusion.evaluate`) on the same validation images (the
split in our run's config), the same noise (seed 0) and the same strided timesteps. A class-conditional
model of ours is scored twice: with the true labels, and unconditionally (its "no class" embedding),
which is the like-for-like number against the unconditional reference.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import yaml

from denoiser.config import config_from_dict
from denoiser.data import load_datasets
from denoiser.diffusion import Diffusion
from denoiser.pipeline import load_model

MSE_TIMESTEPS = (1, 10, 50, 100, 250, 500, 750, 999)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ours", required=True, help="our run folder (config.yaml, model/, train_summary.json)")
    p.add_argument("--reference", required=True, help="reference run folder (model/, summary.json)")
    p.add_argument("--num-images", type=int, default=500)
    p.add_argument("--num-timesteps", type=int, default=100)
    p.add_argument("--out", default="bench/recipe_comparison.md")
    p.add_argument("--ours-command", nargs="+", default=["denoiser", "train", "--config", "configs/cifar10-cpu.yaml"])
    args = p.parse_args()

    ours_dir, ref_dir = Path(args.ours), Path(args.reference)
    cfg = config_from_dict(yaml.safe_load((ours_dir / "config.yaml").read_text()), "ours")
    _, val = load_datasets(cfg.data, 32)
    n = min(args.num_images, len(val))
    x, labels = val.batch(torch.arange(n))
    rows = []
    for name, folder, use_labels in (
        ("denoiser (class labels)", ours_dir, True),
        ("denoiser (unconditional)", ours_dir, False),
        ("diffusers train_unconditional", ref_dir, False),
    ):
        unet, sched = load_model(folder / "model")
        if use_labels and not unet.config.get("num_class_embeds"):
            continue
        res = Diffusion(sched).evaluate(unet, x, labels if use_labels else None, batch_size=100,
                                        num_timesteps=args.num_timesteps)
        rows.append((name, folder, unet, res))
        print(name, f"{res.bits_per_dim:.3f} bits/dim, mse {res.mse_mean:.4f}", flush=True)

    ours_sum = json.loads((ours_dir / "train_summary.json").read_text())
    ref_sum = json.loads((ref_dir / "summary.json").read_text())
    seen = {ours_dir: ours_sum["images_seen"], ref_dir: ref_sum["images_seen"]}
    header = "| recipe | params | images seen | bits/dim | mean MSE | " + " | ".join(f"MSE t={t}" for t in MSE_TIMESTEPS) + " |"
    lines = [header, "|" + "---|" * (5 + len(MSE_TIMESTEPS))]
    for name, folder, unet, res in rows:
        params = sum(p.numel() for p in unet.parameters()) / 1e6
        mse = " | ".join(f"{res.mse_at(t)[1]:.4f}" for t in MSE_TIMESTEPS)
        lines.append(f"| {name} | {params:.2f}M | {seen[folder]:,} | **{res.bits_per_dim:.3f}** | {res.mse_mean:.4f} | {mse} |")
    table = "\n".join(lines)
    md = f"""## Equal-compute comparison with the diffusers recipe

Same machine, same data (CIFAR-10 train JPEGs minus the validation split: {len(val)} images, seed
{cfg.data.val_seed}), same wall-clock: both trained at once for {ref_sum['minutes']:g} minutes, one CPU core each. Evaluated on
{n} validation images, same noise, {args.num_timesteps} strided timesteps (`Diffusion.evaluate`).

{table}

- denoiser: `{' '.join(args.ours_command)}` (`OMP_NUM_THREADS=1`); its recipe is in that config.
- reference: `bench/reference_recipe.py --minutes {ref_sum['minutes']:g}` — diffusers `UNet2DModel` of matched size with attention at
  16x16 and 8x8 (and mid), train_unconditional's defaults: AdamW lr 1e-4, betas (0.95, 0.999), weight decay 1e-6,
  cosine schedule with 500 warm-up steps over 100 epochs, batch 16, EMA (power 3/4, max 0.9999), fp32.
"""
    Path(args.out).write_text(md)
    Path(args.out).with_suffix(".json").write_text(json.dumps(
        [{"recipe": name, "bits_per_dim": r.bits_per_dim, "mse_mean": r.mse_mean, "prior_bpd": r.prior_bpd,
          "decoder_bpd": r.decoder_bpd, "diffusion_bpd": r.diffusion_bpd, "num_images": n,
          "num_timesteps": r.num_timesteps, "images_seen": seen[folder]} for name, folder, _, r in rows], indent=1))
    print(md)


if __name__ == "__main__":
    main()

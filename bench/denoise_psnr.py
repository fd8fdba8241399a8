"""The shipped model as a denoiser against classical ones: PSNR and SSIM on held-out images.

    .venv/bin/pip install bm3d==4.0.3 opencv-python-headless==5.0.0.93   # bench only (pyproject: [bench])
    .venv/bin/python -m bench.denoise_psnr --model weights/cifar10 --config configs/cifar10.yaml \
        --num-images 200 --out bench/denoise_psnr.md --examples docs/denoise-examples.png

Images: the first --num-images of the config's validation split (never trained on); noise: additive
Gaussian of std σ on the [0, 1] scale, unclipped, one fixed seed. Methods, all given the same noisy
image and the true σ:
- denoiser MMSE (one x₀ prediction at the matching timestep) and sampled (the DDPM chain from there);
- BM3D (`bm3d` on PyPI, sigma_psd = σ, all stages);
- OpenCV's non-local means (`fastNlMeansDenoisingColored`; it takes uint8, so the noisy image is
  clipped and rounded for it), its filter strength h tuned per σ on a separate tuning subset;
- the noisy input itself.
PSNR on outputs clipped to [0, 1]; SSIM with an 11×11 Gaussian window (σ 1.5) per channel, averaged.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from denoiser.data import load_datasets
from denoiser.diffusion import Diffusion
from denoiser.folders.model_dir import load_model
from denoiser.image_io import save_grid
from denoiser.restore.chains import denoise, psnr
from denoiser.train.config import load_config

SIGMAS = (0.05, 0.1, 0.2, 0.4)


def ssim(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Mean SSIM per image of (B, C, H, W) batches in [0, 1] (Wang et al. 2004, Gaussian window 11, σ 1.5)."""
    g = torch.exp(-((torch.arange(11, dtype=torch.float64) - 5) ** 2) / (2 * 1.5**2))
    w = (g[:, None] * g[None, :] / g.sum() ** 2).expand(a.shape[1], 1, 11, 11)  # (C, 1, 11, 11)
    a, b = a.double(), b.double()

    def blur(x):
        return F.conv2d(x, w, groups=a.shape[1])  # valid window positions only

    mu_a, mu_b = blur(a), blur(b)
    var_a, var_b, cov = blur(a * a) - mu_a**2, blur(b * b) - mu_b**2, blur(a * b) - mu_a * mu_b
    c1, c2 = 0.01**2, 0.03**2
    s = ((2 * mu_a * mu_b + c1) * (2 * cov + c2)) / ((mu_a**2 + mu_b**2 + c1) * (var_a + var_b + c2))
    return s.flatten(1).mean(1).float()


def bm3d_denoise(noisy: torch.Tensor, sigma: float) -> torch.Tensor:
    import bm3d

    out = [bm3d.bm3d_rgb(img.permute(1, 2, 0).numpy().astype(np.float64), sigma) for img in noisy]  # (H, W, 3) each
    return torch.from_numpy(np.stack(out)).permute(0, 3, 1, 2).float().clamp(0, 1)  # (B, H, W, 3) -> (B, 3, H, W)


def nlm_denoise(noisy: torch.Tensor, h: float) -> torch.Tensor:
    import cv2

    u8 = (noisy.clamp(0, 1) * 255).round().to(torch.uint8).permute(0, 2, 3, 1).numpy()  # (B, H, W, 3)
    out = [cv2.fastNlMeansDenoisingColored(np.ascontiguousarray(img), None, h, h, 3, 7) for img in u8]
    return torch.from_numpy(np.stack(out)).permute(0, 3, 1, 2).float() / 255


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="weights/cifar10")
    p.add_argument("--config", default="configs/cifar10.yaml", help="whose data section gives the validation split")
    p.add_argument("--num-images", type=int, default=200)
    p.add_argument("--tune-images", type=int, default=50, help="validation images after the evaluated ones, for NLM's h")
    p.add_argument("--sampled-images", type=int, default=50, help="images for the (slower) sampled method")
    p.add_argument("--sampled-steps", type=int, default=20)
    p.add_argument("--out", default="bench/denoise_psnr.md")
    p.add_argument("--examples", default="docs/denoise-examples.png")
    args = p.parse_args()

    unet, sched = load_model(args.model)
    cfg = load_config(args.config)
    _, val = load_datasets(cfg.data, unet.config.sample_size)
    n, k = args.num_images, args.tune_images
    clean = val.images[:n].float() / 255  # (N, 3, H, W) in [0, 1]
    labels = val.labels[:n]
    tune = val.images[n : n + k].float() / 255
    rows, examples = [], []
    for i, sigma in enumerate(SIGMAS):
        gen = torch.Generator().manual_seed(1000 + i)
        noisy = clean + sigma * torch.randn(clean.shape, generator=gen)
        tune_noisy = tune + sigma * torch.randn(tune.shape, generator=gen)
        h_grid = [round(v * sigma * 255, 1) for v in (0.4, 0.6, 0.8, 1.0, 1.2, 1.5)]
        h = max(h_grid, key=lambda v: float(psnr(nlm_denoise(tune_noisy, v), tune).mean()))
        results, times = {}, {}
        t = time.perf_counter()
        cond = labels if unet.config.num_class_embeds else None
        results["denoiser MMSE"] = torch.cat([
            denoise(unet, Diffusion(sched), noisy[s : s + 100] * 2 - 1, sigma=sigma,
                    class_label=None if cond is None else cond[s : s + 100]).images
            for s in range(0, n, 100)
        ])
        times["denoiser MMSE"] = time.perf_counter() - t
        m = args.sampled_images
        t = time.perf_counter()
        sampled = denoise(unet, Diffusion(sched), noisy[:m] * 2 - 1, sigma=sigma, method="sample", steps=args.sampled_steps,
                          class_label=None if cond is None else cond[:m]).images
        times["denoiser sampled"] = time.perf_counter() - t
        t = time.perf_counter()
        results["BM3D"] = bm3d_denoise(noisy, sigma)
        times["BM3D"] = time.perf_counter() - t
        t = time.perf_counter()
        results[f"NLM (h = {h:g})"] = nlm_denoise(noisy, h)
        times[f"NLM (h = {h:g})"] = time.perf_counter() - t
        results["noisy input"] = noisy.clamp(0, 1)
        for name, out in results.items():
            rows.append((sigma, name, float(psnr(out, clean).mean()), float(ssim(out, clean).mean()), n,
                         times.get(name, 0.0) / n * 1000))
        rows.append((sigma, f"denoiser sampled ({args.sampled_steps} steps)", float(psnr(sampled, clean[:m]).mean()),
                     float(ssim(sampled, clean[:m]).mean()), m, times["denoiser sampled"] / m * 1000))
        for j in range(3):  # clean, noisy, MMSE, sampled, BM3D, NLM for three images
            examples += [clean[j], noisy[j].clamp(0, 1), results["denoiser MMSE"][j], sampled[j], results["BM3D"][j],
                         results[f"NLM (h = {h:g})"][j]]
        print(f"sigma {sigma}: done", flush=True)
    save_grid(torch.stack(examples), args.examples, nrow=6, scale=3)
    lines = ["| σ | method | PSNR (dB) | SSIM | images | ms / image |", "|---|---|---|---|---|---|"]
    for sigma, name, ps, ss, count, ms in rows:
        lines.append(f"| {sigma} | {name} | {ps:.2f} | {ss:.3f} | {count} | {ms:.1f} |")
    Path(args.out).write_text(
        f"# Denoising: `{args.model}` against classical denoisers\n\n"
        f"`python -m bench.denoise_psnr --model {args.model} --config {args.config} --num-images {n}` "
        f"(validation split of `{args.config}`; see the script's docstring for the protocol).\n\n"
        + "\n".join(lines) + f"\n\nExamples (rows: 3 images per σ = {', '.join(map(str, SIGMAS))}; columns: clean, noisy, "
        f"denoiser MMSE, denoiser sampled, BM3D, NLM): `{args.examples}`.\n"
    )
    print("\n".join(lines))


if __name__ == "__main__":
    main()

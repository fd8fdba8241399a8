"""Denoising whole photos in tiles (denoiser.restore.tiles): PSNR and seconds per megapixel per tile size, overlap,
window and precision, with BM3D and a tuned Gaussian blur on the same noisy photos, side by side in one run.

    .venv/bin/pip install scikit-image bm3d==4.0.3 torch==2.14.1 torchvision==0.29.1   # bench only
    HF_HUB_OFFLINE=1 .venv/bin/python -m bench.denoise_tiles --model weights/cifar10 --sigma 25 --out bench/denoise_tiles.md

Photos: scikit-image's bundled colour photos (astronaut 512x512, coffee 600x400, chelsea 451x300, rocket
640x427), Gaussian noise of σ/255 added with a fixed seed and quantised to 8 bits as a camera writes it;
every method gets the same noisy photos and knows σ. PSNR: mean over the photos against the clean 8-bit
photo. Time: seconds per megapixel on astronaut (512x512), median of `--repeats` rounds in which every
setting runs once in turn (interleaved: a busy machine slows all of them alike), after a warm-up call,
2 threads. BM3D (bm3d 4.0.3, sigma_psd = σ/255, all stages) is timed once (it takes ~100 s/MP).
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from bench.common import cpu_name
from denoiser.diffusion import Diffusion
from denoiser.fast.kernels import load_kernels
from denoiser.folders.model_dir import load_model
from denoiser.restore.tiles import TileOptions, denoise_tiles

PHOTOS = ("astronaut", "coffee", "chelsea", "rocket")
# (tile, overlap, window): the sweep; tile 0 = the model's own size
SETTINGS = [(0, 0, "flat"), (0, 4, "cosine"), (0, 8, "cosine"), (0, 8, "linear"), (0, 8, "flat"), (0, 16, "cosine"),
            (48, 8, "cosine"), (64, 16, "cosine")]


def photos(sigma: float, seed: int = 0) -> list[tuple[str, torch.Tensor, torch.Tensor]]:
    """(name, clean, noisy) as (3, H, W) uint8."""
    from skimage import data

    out = []
    for k, name in enumerate(PHOTOS):
        clean = torch.from_numpy(np.ascontiguousarray(getattr(data, name)()[..., :3])).permute(2, 0, 1)  # (3, H, W)
        noise = torch.randn(clean.shape, generator=torch.Generator().manual_seed(seed + k)) * sigma
        noisy = (clean.float() + noise).clamp(0, 255).round().to(torch.uint8)
        out.append((name, clean, noisy))
    return out


def psnr(a: torch.Tensor, b: torch.Tensor) -> float:
    mse = (a.double() - b.double()).pow(2).mean()
    return float(10 * torch.log10(255**2 / mse))


def gaussian(noisy: torch.Tensor, s: float) -> torch.Tensor:
    """A Gaussian blur of std `s` pixels (reflected edges) of a (3, H, W) uint8 photo."""
    r = max(1, int(3 * s + 0.5))
    k = torch.exp(-torch.arange(-r, r + 1, dtype=torch.float64) ** 2 / (2 * s * s))
    k = (k / k.sum()).float()
    x = F.pad(noisy[:, None].float(), (r, r, r, r), mode="reflect")  # (3, 1, H + 2r, W + 2r)
    x = F.conv2d(F.conv2d(x, k.view(1, 1, 1, -1)), k.view(1, 1, -1, 1))
    return x[:, 0].round().clamp(0, 255).to(torch.uint8)


def interleaved_seconds(fns: list, photo: torch.Tensor, repeats: int) -> list[float]:
    """Median seconds of each fn on `photo` over `repeats` rounds, each round running every fn once in turn."""
    for fn in fns:
        fn(photo[:, :64, :64])  # warm-up: weights packed, allocator primed
    times = [[] for _ in fns]
    for _ in range(repeats):
        for fn, spent in zip(fns, times):
            tic = time.perf_counter()
            fn(photo)
            spent.append(time.perf_counter() - tic)
    return [statistics.median(t) for t in times]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="weights/cifar10")
    p.add_argument("--sigma", type=float, default=25.0, help="noise std on the 0..255 scale")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--skip-bm3d", action="store_true")
    p.add_argument("--out", default=None, help="also write the table here (Markdown)")
    args = p.parse_args()
    torch.set_num_threads(2)
    load_kernels()
    unet, sched = load_model(args.model)
    diffusion, size = Diffusion(sched), unet.config.sample_size
    items = photos(args.sigma)
    mp = sum(c.shape[1] * c.shape[2] for _, c, _ in items) / 1e6
    timing_photo = items[0][2]  # astronaut, 512x512
    timing_mp = timing_photo.shape[1] * timing_photo.shape[2] / 1e6

    def score(fn) -> float:
        return float(np.mean([psnr(fn(noisy), clean) for _, clean, noisy in items]))

    fns = [lambda x, o=TileOptions(tile=t, overlap=ov, window=w): denoise_tiles(unet, diffusion, x, args.sigma / 255, o)
           for t, ov, w in SETTINGS]
    best_s = max(np.arange(0.5, 3.01, 0.1), key=lambda s: score(lambda x: gaussian(x, s)))
    fns.append(lambda x: gaussian(x, best_s))
    seconds = interleaved_seconds(fns, timing_photo, args.repeats)
    rows = [("noisy input", "", "", "", score(lambda x: x), 0.0)]
    for (tile, overlap, window), fn, sec in zip(SETTINGS, fns, seconds):
        rows.append(("denoiser tiles", tile or size, overlap, window, score(fn), sec / timing_mp))
        print(rows[-1], flush=True)
    rows.append((f"Gaussian blur (best std {best_s:.1f} px)", "", "", "", score(fns[-1]), seconds[-1] / timing_mp))
    if not args.skip_bm3d:
        import bm3d

        def run_bm3d(x: torch.Tensor) -> torch.Tensor:
            y = bm3d.bm3d_rgb(x.permute(1, 2, 0).numpy() / 255.0, sigma_psd=args.sigma / 255)
            return torch.from_numpy(np.clip(y * 255, 0, 255).round().astype(np.uint8)).permute(2, 0, 1)

        tic = time.perf_counter()
        run_bm3d(timing_photo)
        sec = time.perf_counter() - tic
        rows.append(("BM3D (bm3d 4.0.3)", "", "", "", score(run_bm3d), sec / timing_mp))
    lines = [f"σ = {args.sigma:g}/255 on {', '.join(PHOTOS)} ({mp:.2f} MP in all); {cpu_name()}, {torch.get_num_threads()} threads; torch {torch.__version__}",
             "", "| method | tile | overlap | window | PSNR (dB) | s / MP |", "|---|---|---|---|---|---|"]
    lines += [f"| {m} | {t} | {o} | {w} | {s:.2f} | {sec:.1f} |" for m, t, o, w, s, sec in rows]
    table = "\n".join(lines)
    print(table)
    if args.out:
        Path(args.out).write_text(table + "\n")


if __name__ == "__main__":
    main()

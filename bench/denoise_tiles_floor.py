"""How fast can a whole photo be denoised in tiles on this CPU? The arithmetic floor against the measured time.

    HF_HUB_OFFLINE=1 .venv/bin/python -m bench.denoise_tiles_floor --model weights/cifar10 --out bench/denoise_tiles_floor.md

Counts the UNet's floating-point operations for one tile (torch.utils.flop_counter, eager), times
`denoise_tiles` with the default options on a 1-megapixel photo (median of `--repeats` calls after a warm-up),
and from the two gives the rate the CPU sustains and what a 12-megapixel photo costs. The floor is the FLOPs a
12-megapixel photo needs at the default tiling divided by the CPU's fp32 FMA peak (2 FMA units of 256 bits a core
on AVX2/AVX-512 Zen and most Xeons: 32 fp32 FLOP a cycle; at lscpu's "CPU max MHz"): no fp32 implementation of
this model can beat it on these cores.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import time
from pathlib import Path

import torch
from torch.utils.flop_counter import FlopCounterMode

from bench.common import cpu_name
from denoiser.diffusion import Diffusion
from denoiser.folders.model_dir import load_model
from denoiser.restore.tiles import TileOptions, denoise_tiles, tile_starts

FLOP_PER_CYCLE = 32  # fp32, per core: two 256-bit FMA pipes (8 lanes x 2 FLOP x 2)
TARGET_MP, TARGET_S = 12.0, 120.0  # issue 35: a 12-megapixel photo in under 2 minutes


def max_ghz() -> tuple[float, str] | None:
    """(GHz, where it came from): lscpu's "CPU max MHz", else /proc/cpuinfo's "cpu MHz" (a VM's nominal clock;
    a core may boost above it, so the peak from it is a lower bound)."""
    try:
        text = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        text = ""
    for line in text.splitlines():
        if line.startswith("CPU max MHz:"):
            return float(line.split(":", 1)[1]) / 1000, "lscpu max"
    cpuinfo = Path("/proc/cpuinfo")
    for line in cpuinfo.read_text().splitlines() if cpuinfo.is_file() else []:
        if line.startswith("cpu MHz"):
            return float(line.split(":", 1)[1]) / 1000, "/proc/cpuinfo nominal; boost may be higher"
    return None


def flops_per_tile(unet, t: int) -> float:
    """Floating-point operations of one tile's UNet call (batch 8, divided), counted in eager mode."""
    x = torch.randn(8, 3, unet.config.sample_size, unet.config.sample_size)
    with torch.inference_mode(), FlopCounterMode(display=False) as counter:
        unet(x, torch.full((8,), t))
    return counter.get_total_flops() / 8


def tiles_for(height: int, width: int, tile: int, overlap: int) -> int:
    return len(tile_starts(height, tile, tile - overlap)) * len(tile_starts(width, tile, tile - overlap))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="weights/cifar10")
    parser.add_argument("--sigma", type=float, default=25.0, help="noise std in 8-bit levels")
    parser.add_argument("--side", type=int, default=1024, help="the timed photo is side x side pixels")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()

    unet, scheduler = load_model(args.model)
    unet.eval()
    diffusion = Diffusion(scheduler)
    opts, tile = TileOptions(), unet.config.sample_size
    t = diffusion.sigma_to_timestep(args.sigma / 255)
    per_tile = flops_per_tile(unet, t)

    g = torch.Generator().manual_seed(0)
    smooth = torch.nn.functional.interpolate(torch.rand(1, 3, args.side // 16, args.side // 16, generator=g), size=args.side, mode="bicubic")[0]
    noisy = (smooth * 255 + torch.randn(smooth.shape, generator=g) * args.sigma).round().clamp(0, 255).to(torch.uint8)  # (3, side, side)
    denoise_tiles(unet, diffusion, noisy[:, :256, :256], args.sigma / 255, opts)  # warm-up
    times = []
    for _ in range(args.repeats):
        tic = time.perf_counter()
        denoise_tiles(unet, diffusion, noisy, args.sigma / 255, opts)
        times.append(time.perf_counter() - tic)
    seconds = statistics.median(times)
    mp = args.side * args.side / 1e6
    tiles = tiles_for(args.side, args.side, tile, opts.overlap)
    rate = tiles * per_tile / seconds  # FLOP/s sustained
    # 12 MP as a 4000 x 3000 photo
    tiles12 = tiles_for(3000, 4000, tile, opts.overlap)
    flop12 = tiles12 * per_tile
    clock, cores = max_ghz(), torch.get_num_threads()
    ghz, source = clock or (None, "")
    peak = FLOP_PER_CYCLE * ghz * 1e9 * cores if ghz else None

    rows = [
        ("UNet FLOPs per tile", f"{per_tile / 1e9:.2f} GFLOP ({tile}x{tile}, eager count)"),
        ("tiles per megapixel, default tiling", f"{tiles / mp:.0f} (tile {tile}, overlap {opts.overlap}; {tiles / mp / (1e6 / tile**2):.2f}x the pixels)"),
        (f"measured: {args.side}x{args.side} photo", f"{seconds:.1f} s = {seconds / mp:.1f} s/MP (median of {args.repeats}: {', '.join(f'{s:.1f}' for s in times)})"),
        ("sustained rate", f"{rate / 1e9:.0f} GFLOP/s"),
        ("12 MP (4000x3000), measured rate", f"{flop12 / rate:.0f} s ({flop12 / 1e12:.1f} TFLOP)"),
    ]
    if peak:
        rows += [("fp32 FMA peak of these cores", f"{peak / 1e9:.0f} GFLOP/s ({cores} x {FLOP_PER_CYCLE} FLOP/cycle x {ghz:.2f} GHz, {source}); measured = {rate / peak:.0%} of it"),
                 ("12 MP at that peak (the floor)", f"{flop12 / peak:.0f} s"),
                 ("rate the 2-minute target needs", f"{flop12 / TARGET_S / 1e9:.0f} GFLOP/s = {flop12 / TARGET_S / peak:.1f}x the peak")]
    text = "\n".join([
        "# Whole-photo denoising: the arithmetic floor on this CPU",
        "",
        "```",
        f"HF_HUB_OFFLINE=1 .venv/bin/python -m bench.denoise_tiles_floor --model {args.model} --out {args.out or '-'}",
        "```",
        "",
        f"Model `{args.model}`, σ = {args.sigma:g}/255, default `TileOptions` (one UNet call per tile). CPU: {cpu_name()}.",
        "",
        "| quantity | value |",
        "|---|---|",
        *(f"| {k} | {v} |" for k, v in rows),
        "",
    ])
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()

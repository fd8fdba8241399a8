"""Seconds per megapixel of the app's tiled denoise (Engine.restore of a denoise, what the Photo tab's Run does) for the shipped
models, and the megapixel limit the work budget gives each (Engine.photo_limit): the numbers behind the limit the Edit
tab shows before an upload. Writes a Markdown table (the notes under it in bench/app_photo_limit.md are by hand).

    HF_HUB_OFFLINE=1 nice -n 10 .venv/bin/python -m bench.app_photo_limit --out bench/app_photo_limit.md
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import statistics
import subprocess
import time

import torch
from PIL import Image

from denoiser.app.engine import Engine
from denoiser.app.work_budget import work_budget


def cpu() -> str:
    """The CPU's name and the flags that matter for fp32/bf16 matmuls."""
    text = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    name = re.search(r"Model name:\s*(.+)", text)
    flags = sorted(set(re.findall(r"\b(avx512\w*|amx\w*|avx2)\b", text)))
    return f"{name.group(1).strip() if name else platform.processor()} ({', '.join(flags) or 'no avx512/amx'})"


def photo(width: int, height: int) -> Image.Image:
    g = torch.Generator().manual_seed(0)
    x = (torch.rand((height, width, 3), generator=g) * 255).to(torch.uint8)  # (H, W, 3)
    return Image.fromarray(x.numpy())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="cifar10,synthetic-shapes")
    p.add_argument("--size", default="500x500", help="photo WxH timed (0.25 MP)")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--out", default=None)
    args = p.parse_args()
    w, h = (int(v) for v in args.size.split("x"))
    engine, rows = Engine(), []
    for model in args.models.split(","):
        request = engine.restore_request("denoise", sigma=0.1)  # the Photo tab's denoise: tiles at the photo's size
        engine.restore(model, request, photo(64, 64))  # warm-up: load, prepare weights
        times, cpu_times = [], []
        for _ in range(args.repeats):
            tic, cpu_tic = time.perf_counter(), time.process_time()
            _, done = engine.restore(model, request, photo(w, h))
            times.append(time.perf_counter() - tic)
            cpu_times.append(time.process_time() - cpu_tic)
        mp = w * h / 1e6
        s_per_mp, cpu_per_mp = statistics.median(times) / mp, statistics.median(cpu_times) / mp
        limit = engine.photo_limit(model)
        quiet = cpu_per_mp / torch.get_num_threads()  # what a quiet machine's wall clock gives at best
        rows.append(f"| {model} | {engine.loaded(model).unet.config.sample_size} | {done.tiles / mp:,.0f} | {engine.photo_work(model, 1000, 1000).units:,.0f} | "
                    f"{s_per_mp:.1f} | {cpu_per_mp:.1f} | {quiet:.1f} | **{limit:.1f}** | {limit * quiet:.0f} |")
    load = os.getloadavg()
    lines = [
        "# The Photo tab's megapixel limit: seconds per megapixel of the tiled denoise and the work budget",
        "",
        "```",
        f"HF_HUB_OFFLINE=1 nice -n 10 .venv/bin/python -m bench.app_photo_limit --size {args.size} --repeats {args.repeats}"
        + (f" --out {args.out}" if args.out else ""),
        "```",
        "",
        f"CPU: {cpu()}, {torch.get_num_threads()} threads, torch {torch.__version__}; load average while it ran "
        f"{load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f} (the machine is shared). A {w}x{h} photo through "
        f"`Engine.restore` of a denoise (one-step MMSE, 4-pixel overlap, cosine window), median of {args.repeats} after a "
        f"warm-up. Work budget: {work_budget():,.0f} units (DENOISER_WORK_BUDGET).",
        "",
        "| model | tile | tiles / MP | work units / MP | wall s / MP | CPU s / MP | CPU s / MP / threads | limit (MP) "
        "| s at the limit (CPU s / threads) |",
        "|---|---|---|---|---|---|---|---|---|",
        *rows,
        "",
    ]
    text = "\n".join(lines)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()

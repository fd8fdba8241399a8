"""DDIM-50 through the door a diffusers user takes, against diffusers' own DDIMPipeline, on this CPU (issue 58's target).

    .venv/bin/python -m bench.pipeline_vs_diffusers [--batch 8] [--repeats 3] [--bf16]

Sides, in one process, alternating run by run after a warm-up run each, median of `--repeats`:
  - denoiser:           `DiffusionPipeline.from_pretrained("weights/cifar10")` called with `batch_size`, DDIM-50, no
                        class (one UNet call a step, as DDIMPipeline's), in the precision every door picks here
                        (denoiser.fast.precision);
  - diffusers fp32:     `DDIMPipeline` with diffusers' `UNet2DModel` at the same widths (bench/sample_throughput.py's
                        `unet2d_like`), as it ships;
  - diffusers bf16:     the same under `torch.autocast("cpu", torch.bfloat16)`, how its users get bf16 on a CPU (moved
                        to bfloat16, the pipeline fails at its final `.numpy()`). Left out where the CPU has no native
                        bfloat16 (`--bf16` runs it anyway): there autocast emulates it, issue 58 sets no bar against it,
                        and on an AVX2-only Zen 3 its runs alone took over 20 minutes.
Prints images/s and the ratios; the CPU and its flags head the output.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time
from pathlib import Path

import torch
from diffusers import DDIMPipeline, DDIMScheduler, DiffusionPipeline

import denoiser  # noqa: F401  (registers DenoiserPipeline with diffusers)
from bench.common import bf16_timed, cpu_name, unet2d_like
from denoiser.fast.precision import choose_precision

FOLDER = Path(__file__).resolve().parent.parent / "weights" / "cifar10"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--bf16", action="store_true", help="time diffusers under bf16 autocast even where it is emulated")
    args = p.parse_args()

    ours = DiffusionPipeline.from_pretrained(FOLDER)
    ours.set_progress_bar_config(disable=True)
    theirs = DDIMPipeline(unet=unet2d_like(ours.unet.config), scheduler=DDIMScheduler.from_config(ours.scheduler.config))
    theirs.set_progress_bar_config(disable=True)

    def run_ours():
        gens = [torch.Generator().manual_seed(k) for k in range(args.batch)]
        ours(args.batch, num_inference_steps=args.steps, guidance_scale=1.0, generator=gens, output_type="np")

    def run_theirs(bf16: bool):
        ctx = torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()
        with ctx:
            theirs(batch_size=args.batch, num_inference_steps=args.steps, generator=torch.Generator().manual_seed(0),
                   output_type="np")

    sides = {"denoiser": run_ours, "diffusers fp32": lambda: run_theirs(False), "diffusers bf16": lambda: run_theirs(True)}
    print(f"CPU: {cpu_name()}, {torch.get_num_threads()} threads, torch {torch.__version__}")
    if not bf16_timed(args.bf16):
        del sides["diffusers bf16"]
        print("diffusers bf16: left out, this CPU has no native bfloat16 (autocast would emulate it; --bf16 runs it)")
    print(f"denoiser's precision here: {choose_precision(ours.unet).describe()}")
    for call in sides.values():
        call()
    times = {k: [] for k in sides}
    for _ in range(args.repeats):
        for name, call in sides.items():
            t0 = time.perf_counter()
            call()
            times[name].append(time.perf_counter() - t0)
    rate = {k: args.batch / statistics.median(v) for k, v in times.items()}
    print(f"DDIM-{args.steps}, batch {args.batch}, median of {args.repeats} after a warm-up, alternating")
    for name, r in rate.items():
        print(f"  {name:15s} {r:.3f} img/s   denoiser is {rate['denoiser'] / r:.2f}x")


if __name__ == "__main__":
    main()

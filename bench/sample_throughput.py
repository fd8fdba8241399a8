"""Sampling images/s: denoiser's sampler vs diffusers' DDIMPipeline / DDPMPipeline, two ways.

    .venv/bin/python -m bench.sample_throughput [--model weights/cifar10] [--batch 8] [--repeats 3] [--ddpm-repeats 1]

Three sides, side by side in one process, alternating after a warm-up (median of the repeats):

- "UNet2DModel": what a user would pick instead: diffusers' own UNet2DModel with the same architecture
  (channels, ResBlocks per level, attention placement, heads, GroupNorm) in DDIMPipeline/DDPMPipeline,
  as they ship (NCHW, diffusers' attention processor). Random weights: speed does not depend on them.
- "pipe+ours": the same pipelines running denoiser's UNet with the shipped weights, NCHW, as loaded.
- "denoiser": denoiser's sampler (`denoiser.sampling.loop.sample`, what the CLI and the app run) on those
  weights: channels-last, the GroupNorm kernel, convolution weights packed once, the small-head
  attention kernel on AVX-512 CPUs, malloc configured (`denoiser.fast.malloc.configure`, as the CLI does).

The two ratios are denoiser / UNet2DModel and denoiser / pipe+ours; "max |diff|" is the largest pixel
difference between denoiser's images and pipe+ours' (the same function: float rounding only).
The default batch, 8, is the app's default number of images.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from diffusers import DDIMPipeline, DDPMPipeline

from bench.common import cpu_name, unet2d_like
from denoiser.fast import malloc
from denoiser.folders.model_dir import load_model
from denoiser.sampling.loop import make_sampler, sample


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="weights/cifar10")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--repeats", type=int, default=3, help="DDIM runs per side")
    p.add_argument("--ddpm-repeats", type=int, default=1, help="DDPM-1000 runs per side (each ~1 min at batch 8)")
    p.add_argument("--ddpm-steps", type=int, default=1000)
    p.add_argument("--ddim-steps", type=int, default=50)
    args = p.parse_args()
    malloc.configure()
    ours_unet, train_sched = load_model(args.model)  # as `denoiser sample` and the app load it
    nchw_unet, _ = load_model(args.model, channels_last=False)  # as diffusers loads it
    theirs_unet = unet2d_like(ours_unet.config)
    n_ours, n_theirs = (sum(p.numel() for p in m.parameters()) / 1e6 for m in (ours_unet, theirs_unet))
    print(f"model {args.model} ({n_ours:.2f}M; UNet2DModel {n_theirs:.2f}M), batch {args.batch}, torch "
          f"{torch.__version__}, {torch.get_num_threads()} threads, CPU {cpu_name()}; DDIM: median of {args.repeats} "
          f"after 1 warm-up, DDPM: median of {args.ddpm_repeats}; alternating")
    print(f"{'sampler':10} {'UNet2DModel':>12} {'pipe+ours':>10} {'denoiser':>9} {'vs UNet2DModel':>15} "
          f"{'vs pipe+ours':>13} {'max |diff|':>11}   (images/s)")
    for name, steps, pipe_cls in (("ddim", args.ddim_steps, DDIMPipeline), ("ddpm", args.ddpm_steps, DDPMPipeline)):
        pipes = [pipe_cls(unet=u, scheduler=make_sampler(name, train_sched.config)) for u in (theirs_unet, nchw_unet)]
        for pipe in pipes:
            pipe.set_progress_bar_config(disable=True)
        sched = make_sampler(name, train_sched.config)

        def run_pipe(pipe, steps=steps):
            seeds = [torch.Generator().manual_seed(k) for k in range(args.batch)]  # image k seeded k: sample(seed=0)'s rule
            return pipe(batch_size=args.batch, num_inference_steps=steps, generator=seeds, output_type="pt").images

        sides = [lambda pipe=pipe: run_pipe(pipe) for pipe in pipes]
        sides.append(lambda sched=sched, steps=steps: sample(ours_unet, sched, args.batch, steps, seed=0).images)
        reps = args.ddpm_repeats if name == "ddpm" else args.repeats
        if name == "ddim":  # warm-up (DDPM-1000 then runs warm)
            for fn in sides:
                fn()
        times, outs = [[] for _ in sides], [None] * len(sides)
        for _ in range(reps):
            for i, fn in enumerate(sides):
                t0 = time.perf_counter()
                outs[i] = fn()
                times[i].append(time.perf_counter() - t0)
        ips = [args.batch / statistics.median(t) for t in times]
        a, b = outs[1], outs[2]
        a = a.permute(0, 3, 1, 2) if a.shape[-1] == 3 else a
        diff = (a - b).abs().max().item()
        print(f"{name + '-' + str(steps):10} {ips[0]:12.3f} {ips[1]:10.3f} {ips[2]:9.3f} {ips[2] / ips[0]:14.2f}x "
              f"{ips[2] / ips[1]:12.2f}x {diff:11.2e}", flush=True)


if __name__ == "__main__":
    main()

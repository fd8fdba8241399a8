"""Sampling images/s: denoiser's sampler vs diffusers' DDIMPipeline / DDPMPipeline on the same weights.

    .venv/bin/python bench/sample_throughput.py [--model weights/cifar10] [--batch 8] [--repeats 3] [--ddpm-repeats 1]

Both run the same UNet weights, the same scheduler settings and the same seed, side by side in one
process, alternating after a warm-up; the median of the repeats is reported with the ratio, and the
largest pixel difference between the two outputs (the same function; channels-last convolutions,
prepacked weights and the upsampler's phase convolutions round differently in the last bits).
denoiser's sampler runs the UNet channels-last under `torch.inference_mode` (each ResBlock, attention
block and upsampler one C++ op, weights prepared once by `UNet.packed_weights()`, freed activation
memory reused between steps); diffusers' pipelines run it as loaded, NCHW, which is how a diffusers
user runs it. "faults/step": minor page faults per step, what the reuse saves. The default batch, 8,
is the app's default number of images.

"ceiling": the ratio if everything but denoiser's convolutions (one profiled UNet call x steps) took
no time.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import time

import torch
from diffusers import DDIMPipeline, DDPMPipeline
from profiling import conv_seconds

from denoiser.pipeline import load_model
from denoiser.sample import make_sampler, sample


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="weights/cifar10")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--repeats", type=int, default=3, help="DDIM runs per side")
    p.add_argument("--ddpm-repeats", type=int, default=1, help="DDPM-1000 runs per side (each ~1 min at batch 8)")
    p.add_argument("--ddpm-steps", type=int, default=1000)
    p.add_argument("--ddim-steps", type=int, default=50)
    args = p.parse_args()
    ours_unet, train_sched = load_model(args.model)  # as `denoiser sample` and the app load it
    theirs_unet, _ = load_model(args.model, channels_last=False)  # as diffusers loads it
    print(f"model {args.model}, batch {args.batch}, torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"DDIM: median of {args.repeats} after 1 warm-up; DDPM: median of {args.ddpm_repeats}; alternating")
    print(f"{'sampler':10} {'diffusers img/s':>16} {'denoiser img/s':>15} {'ratio':>6} {'ceiling':>8} {'max |diff|':>11} "
          f"{'faults/step (d/ours)':>21}")
    x = torch.randn(args.batch, 3, ours_unet.config.sample_size, ours_unet.config.sample_size)
    x = x.contiguous(memory_format=torch.channels_last)
    with torch.inference_mode(), ours_unet.packed_weights():
        ours_unet(x, 500)  # pack
        conv_per_step = conv_seconds(lambda: ours_unet(x, 500))  # one UNet call = one sampling step
    for name, steps, pipe_cls in (("ddim", args.ddim_steps, DDIMPipeline), ("ddpm", args.ddpm_steps, DDPMPipeline)):
        pipe = pipe_cls(unet=theirs_unet, scheduler=make_sampler(name, train_sched.config))
        pipe.set_progress_bar_config(disable=True)
        sched = make_sampler(name, train_sched.config)

        def run_theirs(pipe=pipe, steps=steps):
            return pipe(batch_size=args.batch, num_inference_steps=steps, generator=torch.Generator().manual_seed(0),
                        output_type="pt").images

        def run_ours(sched=sched, steps=steps):
            return sample(ours_unet, sched, args.batch, steps, seed=0).images

        reps = args.ddpm_repeats if name == "ddpm" else args.repeats
        if name == "ddim":  # warm-up (DDPM-1000 then runs warm)
            run_theirs(), run_ours()
        t_theirs, t_ours, faults, outs = [], [], [0, 0], [None, None]
        for _ in range(reps):
            for fn, times, side in ((run_theirs, t_theirs, 0), (run_ours, t_ours, 1)):
                f0, t0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, time.perf_counter()
                outs[side] = fn()
                times.append(time.perf_counter() - t0)
                faults[side] += resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0
        a, b = outs
        a = a.permute(0, 3, 1, 2) if a.shape[-1] == 3 else a
        ips_t, ips_o = args.batch / statistics.median(t_theirs), args.batch / statistics.median(t_ours)
        diff = (a - b).abs().max().item()
        ceiling = statistics.median(t_theirs) / (steps * conv_per_step)
        per_step = "/".join(f"{n / (reps * steps):.0f}" for n in faults)
        print(f"{name + '-' + str(steps):10} {ips_t:16.3f} {ips_o:15.3f} {ips_o / ips_t:5.2f}x {ceiling:7.2f}x "
              f"{diff:11.2e} {per_step:>21}", flush=True)


if __name__ == "__main__":
    main()

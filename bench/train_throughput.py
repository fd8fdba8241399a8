"""Training images/s: denoiser's UNet vs diffusers' UNet2DModel at matched size and attention placement.

    .venv/bin/python -m bench.train_throughput [--batch 32] [--repeats 5] [--configs small ddpm]
    .venv/bin/python -m bench.train_throughput --processes [--rounds 3] ...   # each library's own process settings

One training step = forward + backward + AdamW step of the epsilon loss, batch 32 at 32x32, same
precision for both (fp32, and bf16 autocast). Each model runs as its library runs it by default in
training: denoiser with its per-device choices (channels-last with its NHWC GroupNorm+SiLU kernel;
plain matmul-softmax attention for CPU bf16 training, fused SDPA otherwise; fused AdamW, the same
update in one kernel), diffusers as constructed and as its train_unconditional.py example trains it
(torch's default AdamW).
Steps alternate between the two models after warm-up; the median of the repeats is reported, with the
ratio and the model-FLOPs utilisation against a GEMM rate measured in the same run. In one process both
models share its malloc settings (`malloc.configure()`). `--processes` runs each model in its own child
process instead, alternating for `--rounds`, so each also has its library's process settings: denoiser's
`denoiser train` (`malloc.configure(keep_peak=True)`: no page faults for activations over glibc's 32 MiB mmap
cap), diffusers' train_unconditional.py glibc's defaults; reported is the median over rounds of each
child's median step.

"ceiling" is the ratio denoiser would reach if everything but its convolutions (forward + backward,
timed by the profiler in one extra step) took no time at all: a target above it cannot be met
without changing the numerics.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

import torch
from diffusers import UNet2DModel

from bench.common import ROOT, Runner, conv_seconds, cpu_name, gemm_rate
from denoiser import UNet
from denoiser.fast import malloc
from denoiser.fast.groupnorm import default_channels_last

CONFIGS = {
    # channels 64-128-128, 2 ResBlocks per level, attention at 16x16, 8x8 and mid, one head
    "small": (
        dict(base_channels=64, channel_mult=(1, 2, 2), layers_per_block=2, attention_resolutions=(16, 8), num_heads=1),
        dict(block_out_channels=(64, 128, 128), layers_per_block=2, attention_head_dim=128,
             down_block_types=("DownBlock2D", "AttnDownBlock2D", "AttnDownBlock2D"),
             up_block_types=("AttnUpBlock2D", "AttnUpBlock2D", "UpBlock2D")),
    ),
    # Ho et al. DDPM CIFAR-10: 128 channels x (1, 2, 2, 2), attention at 16x16 and mid, dropout 0.1, one head
    "ddpm": (
        dict(base_channels=128, channel_mult=(1, 2, 2, 2), layers_per_block=2, attention_resolutions=(16,),
             num_heads=1, dropout=0.1),
        dict(block_out_channels=(128, 256, 256, 256), layers_per_block=2, attention_head_dim=256, dropout=0.1,
             down_block_types=("DownBlock2D", "AttnDownBlock2D", "DownBlock2D", "DownBlock2D"),
             up_block_types=("UpBlock2D", "UpBlock2D", "AttnUpBlock2D", "UpBlock2D")),
    ),
}


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def make_runner(side: str, name: str, batch: int, bf16: bool) -> Runner:
    """denoiser with its training defaults for this device and precision, or diffusers as train_unconditional.py
    runs it (NCHW, torch's default AdamW)."""
    ours_kw, theirs_kw = CONFIGS[name]
    if side == "denoiser":
        return Runner(UNet(**ours_kw), batch, bf16, channels_last=default_channels_last("cpu", "bf16" if bf16 else "no"),
                      fused_adam=True)
    return Runner(UNet2DModel(sample_size=32, **theirs_kw), batch, bf16, channels_last=False, fused_adam=False)


def child(args) -> None:
    """One model's median step in this process, under its library's process settings."""
    if args.child == "denoiser":
        malloc.configure(keep_peak=True)  # as `denoiser train`
    runner = make_runner(args.child, args.configs[0], args.batch, args.precisions[0] == "bf16")
    for _ in range(args.warmup):
        runner.step()
    print(json.dumps({"seconds": statistics.median(timed(runner.step) for _ in range(args.repeats))}))


def processes(args) -> None:
    print(f"CPU {cpu_name()}, torch {torch.__version__}, {torch.get_num_threads()} threads, batch {args.batch}, 32x32; "
          f"each model in its own process (denoiser: malloc keep_peak as `denoiser train`; diffusers: glibc defaults), "
          f"{args.rounds} alternating rounds, each the median of {args.repeats} steps after {args.warmup} warm-up steps")
    print(f"{'config':8} {'prec':5} {'diffusers img/s':>16} {'denoiser img/s':>15} {'ratio':>6}")
    for name in args.configs:
        for prec in args.precisions:
            times: dict[str, list[float]] = {"diffusers": [], "denoiser": []}
            for _ in range(args.rounds):
                for side in times:
                    cmd = [sys.executable, "-m", "bench.train_throughput", "--child", side, "--configs", name, "--precisions", prec,
                           "--batch", str(args.batch), "--repeats", str(args.repeats), "--warmup", str(args.warmup)]
                    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=True).stdout
                    times[side].append(json.loads(out.strip().splitlines()[-1])["seconds"])
            theirs, ours = (args.batch / statistics.median(times[k]) for k in ("diffusers", "denoiser"))
            print(f"{name:8} {prec:5} {theirs:16.2f} {ours:15.2f} {ours / theirs:5.2f}x", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--configs", nargs="+", default=["small", "ddpm"], choices=list(CONFIGS))
    p.add_argument("--precisions", nargs="+", default=["fp32", "bf16"], choices=["fp32", "bf16"])
    p.add_argument("--processes", action="store_true", help="each model in its own child process (see the docstring)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--child", choices=["denoiser", "diffusers"], help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        child(args)
        return
    if args.processes:
        processes(args)
        return
    malloc.configure()  # as `denoiser train` does; process-wide, so both models run with it
    print(f"CPU {cpu_name()}, torch {torch.__version__}, {torch.get_num_threads()} threads, batch {args.batch}, 32x32, "
          f"median of {args.repeats} after {args.warmup} warm-up steps, alternating models")
    peak = {"fp32": gemm_rate(torch.float32), "bf16": gemm_rate(torch.bfloat16)}
    print(f"GEMM rate: fp32 {peak['fp32'] / 1e9:.0f} GFLOP/s, bf16 {peak['bf16'] / 1e9:.0f} GFLOP/s")
    print(f"{'config':8} {'prec':5} {'params':>8} {'GFLOP/img':>9} {'diffusers img/s':>16} {'denoiser img/s':>15} "
          f"{'ratio':>6} {'ceiling':>8} {'MFU diff':>9} {'MFU ours':>9}")
    for name in args.configs:
        for prec in args.precisions:
            bf16 = prec == "bf16"
            ours, theirs = (make_runner(side, name, args.batch, bf16) for side in ("denoiser", "diffusers"))
            n_ours = sum(p.numel() for p in ours.model.parameters())
            n_theirs = sum(p.numel() for p in theirs.model.parameters())
            flops = theirs.flops() / args.batch
            for _ in range(args.warmup):
                ours.step()
                theirs.step()
            t_ours, t_theirs = [], []
            for _ in range(args.repeats):
                t_theirs.append(timed(theirs.step))
                t_ours.append(timed(ours.step))
            ceiling = statistics.median(t_theirs) / conv_seconds(ours.step)
            ips_o, ips_t = args.batch / statistics.median(t_ours), args.batch / statistics.median(t_theirs)
            mfu_o, mfu_t = ips_o * flops / peak[prec], ips_t * flops / peak[prec]
            print(f"{name:8} {prec:5} {n_ours / 1e6:6.2f}M {flops / 1e9:9.2f} {ips_t:16.2f} {ips_o:15.2f} "
                  f"{ips_o / ips_t:5.2f}x {ceiling:7.2f}x {mfu_t:8.0%} {mfu_o:8.0%}   (diffusers params {n_theirs / 1e6:.2f}M)", flush=True)


if __name__ == "__main__":
    main()

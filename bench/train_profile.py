"""Where a CPU training step spends its time: the real `TrainLoop.run_step` of a preset, by phase and by kind of op.

    .venv/bin/python -m bench.train_profile [--configs ddpm-cifar10 cifar10] [--batch 32] [--steps 3] [--precision fp32]
    .venv/bin/python -m bench.train_profile --malloc-ab [--rounds 3]   # malloc.configure() vs configure(keep_peak=True)

The loop is `denoiser.train.loop.TrainLoop` as `denoiser train` builds it (channels-last and its kernels, fused AdamW,
diffusers' EMAModel, Accelerate), on the built-in synthetic images at the preset's size so no data set is read.
Each phase of a step (data wait, forward with the loss, backward, gradient clipping, optimizer, EMA) is labelled
with `torch.profiler.record_function`, and every op's self time is put in one kind (convolutions, GroupNorm,
attention, linear layers, the optimizer's kernels, element-wise). The table is the mean of `--steps` profiled steps
after two warm-up steps. Measured numbers and the changes they chose: bench/train_throughput.md.

--malloc-ab times the same steps in child processes that alternate between the two malloc settings (process-wide,
so one process cannot hold both): seconds and minor page faults per step, median of the rounds.
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import torch
from accelerate.state import AcceleratorState

from bench.common import ROOT, cpu_name
from denoiser.fast import malloc
from denoiser.train.config import load_config
from denoiser.train.loop import TrainLoop

PHASES = ("data", "forward+loss", "backward", "clip", "optimizer", "ema")
KINDS = (  # (kind, substrings of the op's name), first match wins
    ("convolution", ("convolution", "conv2d", "mkldnn_conv")),
    ("groupnorm", ("group_norm", "groupnorm")),
    ("attention", ("scaled_dot_product", "attention", "softmax", "bmm", "baddbmm")),
    ("linear", ("addmm", "aten::mm", "linear")),
    ("optimizer", ("adam", "foreach", "lerp")),
    ("dropout", ("dropout", "bernoulli")),
)


def labelled(name: str, fn):
    """`fn` with its calls shown as `name` in the profile."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with torch.profiler.record_function(f"phase::{name}"):
            return fn(*args, **kwargs)
    return wrapper


def build(config: str, batch: int, out: Path, precision: str | None = None) -> TrainLoop:
    """The preset's TrainLoop on synthetic images, its phases labelled; precision overrides train.mixed_precision."""
    AcceleratorState._reset_state(reset_partial_state=True)  # each preset's own Accelerator (precision) in one process
    value = '"no"' if precision == "fp32" else precision  # quoted: YAML reads a bare no as False
    extra = [] if precision is None else [f"train.mixed_precision={value}"]
    cfg = load_config(config, [*extra, f"train.batch_size={batch}", "data.dataset=synthetic", "data.num_images=512",
                               "data.val_size=32", "train.report_to=null", "train.sample_every=0",
                               "train.checkpoint_every=100000", "train.max_steps=100000", "train.lr_warmup_steps=1"])
    loop = TrainLoop(cfg, out, resume=None, overwrite=True, init_from=None)
    acc = loop.accelerator
    loop.diffusion.training_loss = labelled("forward+loss", loop.diffusion.training_loss)
    acc.backward = labelled("backward", acc.backward)
    acc.clip_grad_norm_ = labelled("clip", acc.clip_grad_norm_)
    loop.optimizer.step = labelled("optimizer", loop.optimizer.step)
    for ema in loop.emas:
        ema.step = labelled("ema", ema.step)
    return loop


def kind_of(op: str) -> str:
    low = op.lower()
    return next((kind for kind, keys in KINDS if any(k in low for k in keys)), "element-wise, other")


def profile(loop: TrainLoop, steps: int):
    """(seconds per step unprofiled, phase -> seconds per step, op kind -> self seconds per step, the 12 ops with
    the most self seconds per step)."""
    loop.begin()
    loop.bar.disable = True
    loop.batches.get = labelled("data", loop.batches.get)
    try:
        for _ in range(2):  # warm-up: oneDNN primitives, allocator
            loop.run_step()
        t0 = time.perf_counter()
        for _ in range(steps):
            loop.run_step()
        wall = (time.perf_counter() - t0) / steps
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            for _ in range(steps):
                loop.run_step()
    finally:
        loop.end()
    phases: dict[str, float] = defaultdict(float)
    kinds: dict[str, float] = defaultdict(float)
    for e in prof.key_averages():
        if e.key.startswith("phase::"):
            phases[e.key.split("::", 1)[1]] += e.cpu_time_total / 1e6 / steps
        elif not e.key.startswith("ProfilerStep"):
            kinds[kind_of(e.key)] += e.self_cpu_time_total / 1e6 / steps
    top = sorted(((e.key, e.self_cpu_time_total / 1e6 / steps) for e in prof.key_averages()
                  if not e.key.startswith(("phase::", "ProfilerStep"))), key=lambda kv: -kv[1])[:12]
    return wall, phases, kinds, top


def malloc_child(config: str, batch: int, steps: int, precision: str | None, keep_peak: bool) -> dict:
    """Seconds and minor page faults per step of the real loop under one malloc setting (this process's)."""
    malloc.configure(keep_peak=keep_peak)
    with tempfile.TemporaryDirectory() as tmp:
        loop = build(config, batch, Path(tmp) / "run", precision)
        loop.begin()
        for _ in range(2):
            loop.run_step()
        before, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        for _ in range(steps):
            loop.run_step()
        wall, after = (time.perf_counter() - t0) / steps, resource.getrusage(resource.RUSAGE_SELF)
        loop.end()
        loop.accelerator.end_training()
    return {"seconds": wall, "faults": (after.ru_minflt - before.ru_minflt) / steps,
            "system_seconds": (after.ru_stime - before.ru_stime) / steps}


def malloc_ab(args) -> None:
    print(f"CPU {cpu_name()}, torch {torch.__version__}, {torch.get_num_threads()} threads, batch {args.batch}, "
          f"{args.rounds} rounds of alternating child processes x {args.steps} steps after 2 warm-up steps")
    for config in args.configs:
        res: dict[str, list[dict]] = {"configure()": [], "keep_peak=True": []}
        for _ in range(args.rounds):
            for side in res:
                cmd = [sys.executable, "-m", "bench.train_profile", "--child", side, "--configs", config, "--batch", str(args.batch),
                       "--steps", str(args.steps)] + (["--precision", args.precision] if args.precision else [])
                out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=True).stdout
                res[side].append(json.loads(out.strip().splitlines()[-1]))
        med = {side: {k: statistics.median(r[k] for r in runs) for k in runs[0]} for side, runs in res.items()}
        for side, m in med.items():
            print(f"{config:13} {side:15} {m['seconds'] * 1000:8.0f} ms/step  {m['faults']:9.0f} faults/step  "
                  f"{m['system_seconds'] * 1000:6.0f} ms/step in the kernel")
        a, b = med["configure()"]["seconds"], med["keep_peak=True"]["seconds"]
        print(f"{config:13} keep_peak gain: {100 * (a / b - 1):+.1f}% images/s", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--configs", nargs="+", default=["ddpm-cifar10", "cifar10"])
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--precision", choices=["fp32", "bf16"], default=None, help="default: each preset's mixed_precision")
    p.add_argument("--malloc-ab", action="store_true", help="A/B of malloc.configure(keep_peak=True), child processes")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--child", choices=["configure()", "keep_peak=True"], help=argparse.SUPPRESS)
    args = p.parse_args()
    logging.disable(logging.WARNING)
    if args.child:
        print(json.dumps(malloc_child(args.configs[0], args.batch, args.steps, args.precision, args.child != "configure()")))
        return
    if args.malloc_ab:
        malloc_ab(args)
        return
    malloc.configure(keep_peak=True)  # as `denoiser train` runs
    print(f"CPU {cpu_name()}, torch {torch.__version__}, {torch.get_num_threads()} threads, batch {args.batch}, "
          f"mean of {args.steps} profiled steps after 2 warm-up steps")
    for config in args.configs:
        with tempfile.TemporaryDirectory() as tmp:
            loop = build(config, args.batch, Path(tmp) / "run", args.precision)
            wall, phases, kinds, top = profile(loop, args.steps)
            loop.accelerator.end_training()
        total = sum(kinds.values())
        print(f"\n{config} ({loop.train_cfg.mixed_precision}): {wall * 1000:.0f} ms per step unprofiled ({args.batch / wall:.2f} img/s); "
              f"{total * 1000:.0f} ms of op time per profiled step")
        print("| phase | ms per step | share |\n|---|---|---|")
        for name in PHASES:
            print(f"| {name} | {phases.get(name, 0.0) * 1000:.1f} | {phases.get(name, 0.0) / total:.1%} |")
        print("| kind of op (self time) | ms per step | share |\n|---|---|---|")
        for name, sec in sorted(kinds.items(), key=lambda kv: -kv[1]):
            print(f"| {name} | {sec * 1000:.1f} | {sec / total:.1%} |")
        print("| top ops (self time) | kind | ms per step |\n|---|---|---|")
        for op, sec in top:
            print(f"| `{op}` | {kind_of(op)} | {sec * 1000:.1f} |")


if __name__ == "__main__":
    main()

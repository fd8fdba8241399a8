"""Interleaved A/B of each piece of the CPU fast path: what one UNet call costs with and without it.

    .venv/bin/python -m bench.fast_path_ab [--model weights/cifar10] [--batch 8] [--rounds 15] [--calls 5]
    .venv/bin/python -m bench.fast_path_ab --malloc      # glibc defaults vs denoiser.fast.malloc.configure()

One process, one model; each round runs every configuration once (`--calls` UNet calls, after two
unmeasured ones), in turn, so a machine whose speed drifts slows all of them alike; the median over rounds
is reported, relative to the full fast path. Configurations, each adding one piece to the one before:

    nchw           the modules as a diffusers user runs them: NCHW, torch's GroupNorm and SDPA
    channels-last  channels-last activations, torch's GroupNorm and SDPA
    +groupnorm     denoiser's GroupNorm(+SiLU) kernel (csrc/group_norm_nhwc.cpp)
    +small-head    denoiser's small-head attention kernel (csrc/attention_small_head.cpp)
    +winograd      3x3 convolutions by Winograd's F(4x4, 3x3) (csrc/winograd_conv.cpp) = the full path

--train A/Bs the GroupNorm kernel in training (forward + backward + AdamW, batch 32, the shipped
CIFAR-10 architecture, channels-last both ways), fp32 and bf16 autocast: torch's GroupNorm vs the kernel.

--malloc runs the full path in child processes alternately with glibc's default malloc settings and
with `denoiser.fast.malloc.configure()` (process-wide settings cannot be undone in one process), and
reports ms per call and minor page faults per call.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from bench.common import ROOT, cpu_name
from denoiser.fast import attention, malloc, winograd
from denoiser.folders.model_dir import load_model
from denoiser.model.groupnorm import GroupNorm

NAMES = ["nchw", "channels-last", "+groupnorm", "+small-head", "+winograd"]


@contextlib.contextmanager
def configuration(unet, name: str):
    """Switch the pieces on up to `name` (see the module docstring)."""
    level = NAMES.index(name)
    norms = [m for m in unet.modules() if isinstance(m, GroupNorm)]
    for m in norms:
        m.fast = None if level >= 2 else False
    small_head = attention.small_head_kernel
    if level < 3:
        attention.small_head_kernel = lambda: False  # fused_attention then calls torch's SDPA
    winograd.use_winograd(unet)  # as sampling_context does; switched off below: nn.Conv2d's own forward
    try:
        with winograd.switched(level >= 4):
            yield
    finally:
        attention.small_head_kernel = small_head
        for m in norms:
            m.fast = None


def time_calls(unet, x, labels, calls: int) -> tuple[float, float]:
    """Seconds and minor page faults per UNet call (after two unmeasured calls)."""
    for _ in range(2):
        unet(x, 500, class_labels=labels)
    f0, t0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, time.perf_counter()
    for _ in range(calls):
        unet(x, 500, class_labels=labels)
    return (time.perf_counter() - t0) / calls, (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0) / calls


def run_pieces(args) -> None:
    malloc.configure()  # as the CLI and the app do; without it page faults swamp every difference (--malloc)
    unet, _ = load_model(args.model, channels_last=False)
    size = unet.config.sample_size
    x = torch.randn(args.batch, unet.config.in_channels, size, size, generator=torch.Generator().manual_seed(0))
    labels = torch.arange(args.batch) % unet.config.num_class_embeds if unet.config.num_class_embeds else None
    names = NAMES
    times: dict[str, list[float]] = {n: [] for n in names}
    outs = {}
    with torch.inference_mode():
        for _ in range(args.rounds):
            for name in names:
                nchw = name == "nchw"
                unet.to(memory_format=torch.contiguous_format if nchw else torch.channels_last)
                xi = x if nchw else x.contiguous(memory_format=torch.channels_last)
                with configuration(unet, name):
                    times[name].append(time_calls(unet, xi, labels, args.calls)[0])
                    outs[name] = unet(xi, 500, class_labels=labels).sample
    full = statistics.median(times[names[-1]])
    print(f"{args.model}, batch {args.batch}, torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"CPU {cpu_name()}; median of {args.rounds} interleaved rounds x {args.calls} calls")
    print(f"{'configuration':15} {'ms/call':>8} {'vs full':>8} {'step gain':>10} {'max |diff| vs nchw':>19}")
    prev = None
    for name in names:
        t = statistics.median(times[name])
        gain = "" if prev is None else f"{100 * (prev / t - 1):+.1f}%"
        diff = (outs[name] - outs["nchw"]).abs().max().item()
        print(f"{name:15} {1000 * t:8.1f} {t / full:7.2f}x {gain:>10} {diff:19.1e}")
        prev = t


def run_train(args) -> None:
    from bench.common import Runner
    from denoiser import UNet

    malloc.configure()
    config = UNet.load_config(str(Path(args.model) / "unet"))
    print(f"{args.model} architecture, training batch {args.train_batch}, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads, CPU {cpu_name()}; median of {args.rounds} interleaved rounds x "
          f"{args.calls} steps")
    for bf16 in (False, True):
        runner = Runner(UNet.from_config(config), args.train_batch, bf16, channels_last=True, fused_adam=True)
        norms = [m for m in runner.model.modules() if isinstance(m, GroupNorm)]
        times: dict[str, list[float]] = {"torch GroupNorm": [], "+groupnorm kernel": []}
        for _ in range(args.rounds):
            for name, fast in (("torch GroupNorm", False), ("+groupnorm kernel", None)):
                for m in norms:
                    m.fast = fast
                runner.step()
                t0 = time.perf_counter()
                for _ in range(args.calls):
                    runner.step()
                times[name].append((time.perf_counter() - t0) / args.calls)
        a, b = (statistics.median(v) for v in times.values())
        print(f"{'bf16' if bf16 else 'fp32'}: torch GroupNorm {1000 * a:7.1f} ms/step, kernel {1000 * b:7.1f} ms/step, "
              f"gain {100 * (a / b - 1):+.1f}%")


def run_malloc_child(args) -> None:
    if args.child == "tuned":
        malloc.configure()
    unet, _ = load_model(args.model)
    size = unet.config.sample_size
    x = torch.randn(args.batch, 3, size, size).contiguous(memory_format=torch.channels_last)
    labels = torch.arange(args.batch) % unet.config.num_class_embeds if unet.config.num_class_embeds else None
    with torch.inference_mode():
        time_calls(unet, x, labels, 3)  # warm-up: thresholds
        print(json.dumps(time_calls(unet, x, labels, args.calls)))


def run_malloc(args) -> None:
    base = [sys.executable, "-m", "bench.fast_path_ab", "--model", args.model, "--batch", str(args.batch), "--calls", str(args.calls)]
    res: dict[str, list[tuple[float, float]]] = {"default": [], "tuned": []}
    for _ in range(args.rounds):
        for side in res:
            out = subprocess.run(base + ["--child", side], cwd=ROOT, capture_output=True, text=True, check=True).stdout
            res[side].append(tuple(json.loads(out.strip().splitlines()[-1])))
    print(f"{args.model}, batch {args.batch}, torch {torch.__version__}, CPU {cpu_name()}; "
          f"{args.rounds} alternating processes x {args.calls} calls (after 5 warm-up calls)")
    med = {k: (statistics.median(t for t, _ in v), statistics.median(f for _, f in v)) for k, v in res.items()}
    for side, (t, f) in med.items():
        print(f"malloc {side:8} {1000 * t:8.1f} ms/call  {f:9.0f} page faults/call")
    print(f"tuned / default time: {med['tuned'][0] / med['default'][0]:.3f}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="weights/cifar10")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--calls", type=int, default=5)
    p.add_argument("--malloc", action="store_true", help="A/B of denoiser.fast.malloc.configure() (child processes)")
    p.add_argument("--train", action="store_true", help="A/B of the GroupNorm kernel in training")
    p.add_argument("--train-batch", type=int, default=32)
    p.add_argument("--child", choices=["default", "tuned"], help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        run_malloc_child(args)
    elif args.malloc:
        run_malloc(args)
    elif args.train:
        run_train(args)
    else:
        run_pieces(args)


if __name__ == "__main__":
    main()

"""Shared by the throughput benchmarks: the CPU's name and instruction sets for every header, sides timed interleaved
round by round, whether to time bfloat16 here, and how long the convolutions alone take in one profiled call.

The convolutions already run near this CPU's GEMM rate, so (competitor's time) / (our convolution
time) is the ratio we would reach if everything else took no time: the ceiling for any target.
"""

from __future__ import annotations

import contextlib
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

CONV_OPS = (
    "aten::mkldnn_convolution", "aten::convolution_backward", "aten::_convolution_depthwise2d",
    "mkldnn::_convolution_pointwise",  # prepacked weights (UNet.packed_weights)
)


def conv_seconds(fn: Callable[[], object]) -> float:
    """Self CPU time of the convolution kernels (forward and backward) while `fn()` runs once."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fn()
    return sum(e.self_cpu_time_total for e in prof.key_averages() if e.key in CONV_OPS) / 1e6


def cpu_name() -> str:
    flags = ""
    with contextlib.suppress(OSError):
        text = Path("/proc/cpuinfo").read_text()
        name = next((line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("model name")), "")
        flags = next((line for line in text.splitlines() if line.startswith("flags")), "").split()
        isa = [f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16") if f in flags]
        return f"{name or platform.processor()} ({', '.join(isa) or 'no AVX2'})"
    return platform.processor() or platform.machine()


def bf16_timed(forced: bool) -> bool:
    """Whether a benchmark times a bfloat16 side: the CPU does bf16 natively (or cannot tell), or `--bf16` forced it.
    Elsewhere autocast emulates bf16 (0.16x float32 on an AVX2-only Zen 3, where one such side ran over 20 minutes)
    and issue 58 sets no bf16 bar."""
    from denoiser.fast.precision import native_bf16  # the caller has put the repository on sys.path

    return forced or native_bf16() is not False


def interleaved(sides: dict, rounds: int) -> dict[object, list[float]]:
    """Seconds of each side (a callable) over `rounds` rounds, each round running every side once in turn, after a
    warm-up round that is not counted."""
    seconds: dict[object, list[float]] = {key: [] for key in sides}
    for r in range(rounds + 1):  # round 0 warms up
        for key, fn in sides.items():
            start = time.perf_counter()
            fn()
            if r:
                seconds[key].append(time.perf_counter() - start)
    return seconds


def spread(seconds: list[float]) -> str:
    """"median 12.43 s, fastest 10.98 s (10.98, 12.69, 12.63, 12.23)"."""
    return (f"median {statistics.median(seconds):.2f} s, fastest {min(seconds):.2f} s "
            f"({', '.join(f'{t:.2f}' for t in seconds)})")

"""The precision inference runs in, chosen once per process by measurement: float32, or bfloat16 autocast where this
CPU computes bfloat16 faster.

A CPU with native bfloat16 instructions (AVX512-BF16, AMX) is not always faster in bfloat16: on a Zen 4 oneDNN's
bf16 convolutions run about 2.4x its fp32 ones, while on a Sapphire Rapids VM without AMX they run at half the fp32
rate (vdpbf16ps on one port against two fp32 FMA ports; bench/cpu_roofline.md). So nothing is assumed from the
flags: `choose_precision()` times the UNet's commonest op, a 3x3 channels-last convolution, in float32 (as sampling
runs it: by Winograd's algorithm where denoiser's kernel is built) and under bf16 autocast, interleaved, and keeps
bfloat16 only when it is at least `MIN_SPEEDUP` faster. A CPU whose flags show no native bf16 (an AVX2-only CPU
emulates it, several times slower) is not measured. The measurement takes tens of
milliseconds, once per process, at the first sampling call.

Every door samples through `denoiser.sampling.loop.sampling_context`, which enters `autocast(module)`; a plan names the
precision that ran (`denoiser.sampling.plan.Plan.describe`, the CLI's line, the app's status and PNG settings).
A model's `dtype_asked` holds it to a precision: diffusers' `from_pretrained(..., torch_dtype=torch.float32)` sets it,
and `asked(unet, dtype)` for a block (benchmarks and tests); DENOISER_PRECISION=float32|bfloat16 sets it for the
process. Attention maps are captured in float32
(`full_precision()`): the exact weights of the float32 model at that step's input, whatever the sampling ran in.
"""

from __future__ import annotations

import contextlib
import functools
import os
import statistics
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from denoiser.fast import winograd

__all__ = ["Precision", "choose_precision", "autocast", "asked", "full_precision", "native_bf16", "PRECISION_ENV", "MIN_SPEEDUP"]

PRECISION_ENV = "DENOISER_PRECISION"  # "auto" (default: measured), "float32" or "bfloat16"
MIN_SPEEDUP = 1.10  # bf16 must beat fp32 by this much: it costs accuracy (max |Δε| ~0.02 on the shipped models)
_NAMES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16}
_LOCK = threading.Lock()


@dataclass(frozen=True)
class Precision:
    """What a UNet call runs in: `dtype` float32, or bfloat16 under CPU autocast; `why` says how it was chosen."""

    dtype: torch.dtype
    why: str
    autocast: bool = False  # float32 weights run under bf16 autocast (the CPU's choice), not weights in `dtype`

    @property
    def name(self) -> str:
        return _name(self.dtype)

    def describe(self) -> str:
        return f"{self.name} ({self.why})"


def _name(dtype: torch.dtype) -> str:
    return "bfloat16" if dtype == torch.bfloat16 else "float32"


def native_bf16() -> bool | None:
    """Whether the CPU's flags list native bfloat16 dot products (avx512_bf16, amx_bf16; Arm's bf16); None where the
    flags cannot be read (not Linux)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith(("flags", "Features")):
            flags = set(line.split(":", 1)[1].split())
            return bool(flags & {"avx512_bf16", "amx_bf16", "bf16"})
    return None


def _time_conv(dtype_autocast: bool, x: torch.Tensor, conv: nn.Module) -> float:
    start = time.perf_counter()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype_autocast):
        conv(x)
    return time.perf_counter() - start


@torch.inference_mode()
def measure_bf16_speedup(repeats: int = 5) -> float:
    """fp32 time / bf16-autocast time of a 3x3 convolution the size of the shipped UNets' middle ones (128 channels,
    16x16, batch 8, channels-last), interleaved after a warm-up, median of `repeats`. Each side runs as a sampling
    call would: float32 by Winograd's algorithm where its kernel is built (`denoiser.fast.winograd`), bf16 autocast
    by torch's convolution."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(8, 128, 16, 16, generator=g).contiguous(memory_format=torch.channels_last)
    conv = nn.Conv2d(128, 128, 3, padding=1, bias=False).to(memory_format=torch.channels_last)
    winograd.use_winograd(conv)
    for bf16 in (False, True):  # warm-up: oneDNN builds each kernel on its first call, Winograd transforms the weight
        _time_conv(bf16, x, conv)
    fp32, bf16 = [], []
    for _ in range(repeats):
        fp32.append(_time_conv(False, x, conv))
        bf16.append(_time_conv(True, x, conv))
    return statistics.median(fp32) / statistics.median(bf16)


@functools.cache
def _cpu_choice() -> Precision:
    """The CPU's precision, decided once per process (env, then flags, then measurement)."""
    asked = os.environ.get(PRECISION_ENV, "auto").strip().lower()
    if asked in _NAMES:
        return Precision(_NAMES[asked], f"{PRECISION_ENV}={asked}", autocast=_NAMES[asked] == torch.bfloat16)
    if asked not in ("", "auto"):
        raise ValueError(f"{PRECISION_ENV} must be auto, float32 or bfloat16, got {asked!r}")
    if native_bf16() is False:
        return Precision(torch.float32, "this CPU has no native bfloat16")
    speedup = measure_bf16_speedup()
    if speedup >= MIN_SPEEDUP:
        return Precision(torch.bfloat16, f"measured {speedup:.2f}x float32 on this CPU", autocast=True)
    return Precision(torch.float32, f"bfloat16 measured {speedup:.2f}x float32 on this CPU")


def choose_precision(module: nn.Module | None = None) -> Precision:
    """The precision `module`'s inference runs in here: the one asked for (its `dtype_asked`: diffusers'
    torch_dtype, or `asked`), the model's own for anything but float32 weights on the CPU (other devices and dtypes
    run as given); else this process's CPU choice."""
    if module is not None:
        wanted = getattr(module, "dtype_asked", None)
        if wanted in (torch.float32, torch.bfloat16):  # from_pretrained(torch_dtype=torch.float32), or `asked`
            return Precision(wanted, f"{_name(wanted)} was asked for", autocast=wanted == torch.bfloat16)
        param = next(module.parameters(), None)
        if param is not None and (param.device.type != "cpu" or param.dtype != torch.float32):
            return Precision(param.dtype, f"the model's own, on {param.device.type}")
    with _LOCK:  # one measurement, even when the app's threads sample at once
        return _cpu_choice()


def autocast(module: nn.Module | None) -> contextlib.AbstractContextManager[None]:
    """The block's UNet calls in `choose_precision(module)`'s precision: bf16 CPU autocast, or as they are."""
    if choose_precision(module).autocast:
        return torch.autocast("cpu", dtype=torch.bfloat16)
    return contextlib.nullcontext()


@contextlib.contextmanager
def asked(module: nn.Module, dtype: torch.dtype) -> Iterator[None]:
    """Inside, `module` runs in `dtype` as if it had been loaded with torch_dtype=dtype (its `dtype_asked`)."""
    before = getattr(module, "dtype_asked", None)
    module.dtype_asked = dtype
    try:
        yield
    finally:
        module.dtype_asked = before


def full_precision() -> contextlib.AbstractContextManager[None]:
    """Inside, no autocast: the float32 computation (what an attention capture records)."""
    return torch.autocast("cpu", enabled=False)

"""The precision inference runs in on a CPU: float32; "mixed", the matrix products in bfloat16 and the rest in
float32 (`denoiser.fast.mixed`); or "bfloat16", whole calls under bf16 autocast. Where this machine computes bf16
faster, the fastest of the two by measurement. A property of the machine, decided once, kept in a file, and carried
by each plan to its run.

Why it is measured: a CPU with native bfloat16 instructions (AVX512-BF16, AMX) is not always faster in bfloat16. On a
Zen 4 oneDNN's bf16 convolutions ran about 2.4x its fp32 ones, while on a Sapphire Rapids VM without AMX they ran at
half the fp32 rate (bench/cpu_roofline.md), and denoiser's float32 3x3 convolutions run by Winograd's algorithm, which
bf16 autocast does not use. A CPU whose flags show no native bf16 (an AVX2-only CPU emulates it, several times
slower) keeps float32 unmeasured.

Why once per machine: a choice re-timed in every process flips with the machine's load (one command on a Zen 4
measured bf16 at 0.42x, 1.91x, 0.94x and 0.59x float32 in four runs), and bf16 moves the pixels (up to 7/255), so the
same command gave another picture. The decision is keyed by what it depends on (`machine_key`: the CPU's model and
flags, the torch version, the kernel build) and written to `precision-<key>.json` beside the kernels
(`decision_path`): every later process reads it. It is measured once (`measure`): whole UNet calls at the rows a
Generate runs (16 and 32), float32, the mix and bf16 autocast interleaved, `ROUNDS` rounds after a warm-up; a bf16
path is kept only when its median speed-up over float32 is at least `MIN_SPEEDUP` and no round measured it slower,
and of two that pass, the faster (`rule`). `denoiser build-kernels`
decides it at install (on the shipped models' architecture), so no first call pays; without it, the first inference
in a machine measures its model once (~10 s) and writes the file.

What runs (`choose_precision`), first match wins: a request's precision (`--precision`, the app's control, a saved
PNG's settings); a model's `dtype_asked` (diffusers' `from_pretrained(..., torch_dtype=torch.float32)`, or `asked`
for a block); a model in another dtype or on another device, as it is; DENOISER_PRECISION for the process; the
machine's decision. A plan chooses once (`denoiser.sampling.plan.resolve`) and its run holds that choice
(`running`), which `autocast` reads. Attention maps are captured in float32 (`full_precision`): the exact weights of
the float32 model at that step's input, whatever the sampling ran in.
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import json
import logging
import os
import platform
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from denoiser.atomic import atomic_path
from denoiser.fast import batch_invariant, kernels, mixed, winograd
from denoiser.request import PRECISIONS

__all__ = ["Precision", "CHOICES", "PRECISION_ENV", "MIN_SPEEDUP", "ROUNDS", "ROWS", "CANDIDATES", "parse_choice", "choose_precision",
           "machine_precision", "machine_key", "decision_path", "measure", "rule", "running", "autocast", "asked",
           "full_precision", "native_bf16"]

log = logging.getLogger(__name__)

PRECISION_ENV = "DENOISER_PRECISION"  # "auto" (default: the machine's decision), "float32", "mixed" or "bfloat16"
CHOICES = PRECISIONS  # what a request, the CLI's --precision and the app offer
CANDIDATES = CHOICES[1:]  # the paths a machine chooses between (float32 first: the baseline)
DECISION_VERSION = 3  # in the decision's key: a file written before the mix (2) or the bf16 small-head attention (3) is measured again
MIN_SPEEDUP = 1.15  # bf16 must beat fp32 by this much (median): it costs accuracy (max |Δε| ~0.02 on the shipped models)
ROUNDS = 7  # measured rounds, each every row count in both precisions, after one warm-up round
ROWS = (16, 32)  # rows per UNet call: a Generate of 8 images with guidance, and the CPU's largest call (32 rows)
_NAMES = {"auto": "auto", "": "auto", "float32": "float32", "fp32": "float32", "bfloat16": "bfloat16", "bf16": "bfloat16",
          "mixed": "mixed", "mix": "mixed", "bf16-mix": "mixed"}
_LOCK = threading.Lock()
_MACHINE: dict[str, Precision] = {}  # this process's reading of the machine's decision, by decision file
_RUNNING: contextvars.ContextVar[Precision | None] = contextvars.ContextVar("denoiser_precision", default=None)


@dataclass(frozen=True)
class Precision:
    """What a UNet call runs in: `dtype` float32, or bfloat16 under CPU autocast (`autocast`) or in the per-op mix
    (`mixed`); `why` says how it was chosen."""

    dtype: torch.dtype
    why: str
    autocast: bool = False  # float32 weights run under bf16 autocast (the CPU's choice), not weights in `dtype`
    mixed: bool = False  # float32 weights, the matrix products in bf16 (denoiser.fast.mixed)

    @property
    def name(self) -> str:
        return "mixed" if self.mixed else _name(self.dtype)

    def describe(self) -> str:
        return f"{self.name} ({self.why})"


def _name(dtype: torch.dtype) -> str:
    return "bfloat16" if dtype == torch.bfloat16 else "float32"


def _of(choice: str, why: str) -> Precision:
    """The Precision a choice of CANDIDATES names."""
    return Precision(torch.float32 if choice == "float32" else torch.bfloat16, why, autocast=choice == "bfloat16",
                     mixed=choice == "mixed")


def parse_choice(text: str | None, what: str = "precision") -> str:
    """"auto", "float32" or "bfloat16" from what a person typed (None: auto; fp32/bf16 accepted)."""
    key = "auto" if text is None else str(text).strip().lower()
    if key not in _NAMES:
        raise ValueError(f"{what} must be auto, float32, mixed or bfloat16, got {text!r}")
    return _NAMES[key]


def native_bf16() -> bool | None:
    """Whether the CPU's flags list native bfloat16 dot products (avx512_bf16, amx_bf16; Arm's bf16); None where the
    flags cannot be read (not Linux)."""
    flags = _cpu_field(("flags", "Features"))
    return None if flags is None else bool(set(flags.split()) & {"avx512_bf16", "amx_bf16", "bf16"})


def _cpu_field(names: tuple[str, ...]) -> str | None:
    lines = kernels.cpuinfo().splitlines()
    return next((line.split(":", 1)[1].strip() for line in lines if line.startswith(names)), None)


def machine_key() -> str:
    """What the decision depends on: the CPU's model and instruction flags, torch's version, and the kernel build that
    runs (its path names torch, compiler flags, CPU and sources; or why none runs)."""
    build = kernels.library_path().name if kernels.load_kernels() else f"no kernels: {kernels.kernel_error()}"
    h = hashlib.sha1()
    for part in (_cpu_field(("model name",)) or platform.processor(), _cpu_field(("flags", "Features")) or "",
                 torch.__version__, build, DECISION_VERSION):
        h.update(str(part).encode() + b"\0")
    return h.hexdigest()[:16]


def decision_path() -> Path:
    """This machine's decision file, beside the kernel builds (~/.cache/denoiser/kernels, or $DENOISER_KERNEL_CACHE)."""
    return kernels.library_path().parent.parent / f"precision-{machine_key()}.json"


def rule(ratios: dict[str, list[float]]) -> str:
    """The decision from each bf16 path's rounds of float32 time / its time: of the paths whose median is at least
    MIN_SPEEDUP and whose every round is at least 1, the one with the highest median; float32 when none passes."""
    passing = {k: statistics.median(r) for k, r in ratios.items() if statistics.median(r) >= MIN_SPEEDUP and min(r) >= 1.0}
    return max(passing, key=passing.get) if passing else "float32"


@torch.inference_mode()
def measure(unet: nn.Module, rounds: int = ROUNDS, rows: tuple[int, ...] = ROWS) -> dict:
    """The machine's table: `unet`'s whole calls at `rows` rows in each of CANDIDATES (float32 with its 3x3
    convolutions by Winograd's algorithm where the kernel is built, as sampling runs them; the mix; bf16 autocast),
    interleaved, `rounds` rounds after a warm-up. Returns the times, each path's rounds of float32 time / its time,
    and the decision (`rule`)."""
    config = unet.config
    g = torch.Generator().manual_seed(0)
    size = (config.in_channels, config.sample_size, config.sample_size)
    inputs = {}
    for n in rows:
        kwargs = {"class_labels": torch.zeros(n, dtype=torch.long)} if config.num_class_embeds else {}
        if getattr(config, "cross_attention_dim", None):
            kwargs["encoder_hidden_states"] = torch.randn(n, 8, config.cross_attention_dim, generator=g)
        x = torch.randn(n, *size, generator=g).contiguous(memory_format=torch.channels_last)
        inputs[n] = (x, torch.full((n,), 500), kwargs)
    winograd.use_winograd(unet)
    batch_invariant.use_batch_invariant(unet)
    mixed.use_mixed(unet)

    def call(choice: str) -> float:
        start = time.perf_counter()
        with _context(_of(choice, "measured")):
            for n in rows:
                x, t, kwargs = inputs[n]
                unet(x, t, **kwargs)
        return time.perf_counter() - start

    times: dict[str, list[float]] = {c: [] for c in CANDIDATES}
    for k in range(rounds + 1):  # round 0 warms up: oneDNN builds its kernels, Winograd transforms the weights
        for choice in CANDIDATES:
            seconds = call(choice)
            if k:
                times[choice].append(seconds)
    ratios = {c: [a / b for a, b in zip(times["float32"], times[c])] for c in CANDIDATES[1:]}
    return {"choice": rule(ratios), "speedup": {c: round(statistics.median(r), 3) for c, r in ratios.items()},
            "spread": {c: [round(min(r), 3), round(max(r), 3)] for c, r in ratios.items()},
            "seconds": {k: [round(s, 4) for s in v] for k, v in times.items()}, "rows": list(rows),
            "rule": f"of the bf16 paths whose median ratio >= {MIN_SPEEDUP} and every round >= 1.0, the fastest; "
                    "else float32",
            "model": {k: v for k, v in dict(config).items() if not k.startswith("_")}}


def machine_precision(reference: Callable[[], nn.Module] | None = None) -> Precision:
    """The machine's decision: read from its file, else measured once on `reference()` (a float32 CPU UNet) and
    written. A CPU without native bf16 keeps float32 unmeasured; without a file and a reference, float32 for now."""
    if native_bf16() is False:
        return Precision(torch.float32, "this CPU has no native bfloat16")
    path = decision_path()
    with _LOCK:  # one measurement, even when the app's threads sample at once
        if str(path) in _MACHINE:
            return _MACHINE[str(path)]
        table = _read(path)
        if table is None:
            if reference is None:
                return Precision(torch.float32, "this machine's precision is not decided yet")
            log.warning("denoiser: deciding this machine's inference precision once (whole UNet calls in float32 and "
                        "bfloat16, ~10 s; `denoiser build-kernels` does it at install): %s", path)
            table = {**measure(reference()), "cpu": _cpu_field(("model name",)), "torch": torch.__version__}
            with atomic_path(path) as tmp:
                tmp.write_text(json.dumps(table, indent=1) + "\n")
        _MACHINE[str(path)] = _of(table["choice"], "this machine's: " + ", ".join(
            f"{c} {table['speedup'][c]:.2f}x float32 ({table['spread'][c][0]:.2f}-{table['spread'][c][1]:.2f}x)"
            for c in table["speedup"]))
        return _MACHINE[str(path)]


def _read(path: Path) -> dict | None:
    try:
        table = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    ok = (isinstance(table, dict) and table.get("choice") in CANDIDATES and isinstance(table.get("speedup"), dict)
          and isinstance(table.get("spread"), dict) and set(table["speedup"]) == set(table["spread"]))
    return table if ok else None


def choose_precision(module: nn.Module | None = None, request: str | None = None,
                     reference: Callable[[], nn.Module] | None = None) -> Precision:
    """The precision `module`'s inference runs in here (the module docstring's order): `request` ("auto" or None:
    not asked), the module's `dtype_asked` or own dtype and device, DENOISER_PRECISION, then the machine's decision
    (measured on `reference()`, default: the module itself, if no file holds it)."""
    asked_for = parse_choice(request)
    if asked_for != "auto":
        return _of(asked_for, f"{asked_for} was asked for")
    if module is not None:
        wanted = getattr(module, "dtype_asked", None)
        if wanted in (torch.float32, torch.bfloat16):  # from_pretrained(torch_dtype=torch.float32), or `asked`
            return Precision(wanted, f"{_name(wanted)} was asked for", autocast=wanted == torch.bfloat16)
        param = next(module.parameters(), None)
        if param is not None and (param.device.type != "cpu" or param.dtype != torch.float32):
            return Precision(param.dtype, f"the model's own, on {param.device.type}")
    env = parse_choice(os.environ.get(PRECISION_ENV), PRECISION_ENV)
    if env != "auto":
        return _of(env, f"{PRECISION_ENV}={env}")
    if reference is None and module is not None:
        reference = lambda: module  # noqa: E731  (the first model a machine runs decides, when nothing did at install)
    return machine_precision(reference)


@contextlib.contextmanager
def running(precision: Precision) -> Iterator[None]:
    """Inside (this thread, this call), UNet calls run in `precision`: what a plan chose, held for its whole run."""
    token = _RUNNING.set(precision)
    try:
        yield
    finally:
        _RUNNING.reset(token)


def autocast(module: nn.Module | None) -> contextlib.AbstractContextManager[None]:
    """The block's UNet calls in the running plan's precision (`running`), else `choose_precision(module)`'s: bf16
    CPU autocast, the per-op mix (its modules swapped in first), or as they are."""
    chosen = _RUNNING.get() or choose_precision(module)
    if chosen.mixed and module is not None:
        mixed.use_mixed(module)
    return _context(chosen)


def _context(chosen: Precision) -> contextlib.AbstractContextManager[None]:
    if chosen.autocast:
        return torch.autocast("cpu", dtype=torch.bfloat16)
    if chosen.mixed:
        return mixed.on()
    return mixed.off()


@contextlib.contextmanager
def asked(module: nn.Module, dtype: torch.dtype) -> Iterator[None]:
    """Inside, `module` runs in `dtype` as if it had been loaded with torch_dtype=dtype (its `dtype_asked`)."""
    before = getattr(module, "dtype_asked", None)
    module.dtype_asked = dtype
    try:
        yield
    finally:
        module.dtype_asked = before


@contextlib.contextmanager
def full_precision() -> Iterator[None]:
    """Inside, no autocast and no mix: the float32 computation (what an attention capture records)."""
    with torch.autocast("cpu", enabled=False), mixed.off():
        yield

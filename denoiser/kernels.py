"""denoiser's C++ extension: built on first use, loaded once, optional.

CPU sources (`denoiser/csrc/`):
- `group_norm_nhwc.cpp`: GroupNorm (+ the SiLU that follows it) for channels-last tensors, forward and
  backward; used by `denoiser.groupnorm`.
- `attention_small_head.cpp`: scaled dot-product attention for small heads (d = 16, 32) on fp32 CPU
  tensors, forward only; the fast path of `denoiser.attention` there.
- `unet_blocks.cpp`: the UNet's ResBlock, pixel-attention block and upsampler as single inference ops,
  the same ATen calls as the modules' `forward` without the Python between them; used by `denoiser.unet`.
- `allocation_cache.cpp`: a caching CPU allocator for sampling loops (`cached_cpu_allocations`).

The extension is compiled with torch's C++-extension builder (about 15 s with g++, cached under
~/.cache/torch_extensions and keyed by this CPU's instruction set, since it is built -march=native).
Without a C++ compiler, or with DENOISER_KERNELS=0, everything runs on the reference paths and only
speed changes.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import platform
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path

import torch

__all__ = ["load_kernels", "kernel_error", "cached_cpu_allocations", "plain_tensors"]

log = logging.getLogger(__name__)

_CSRC = Path(__file__).parent / "csrc"
_SOURCES = [
    _CSRC / name
    for name in ("group_norm_nhwc.cpp", "attention_small_head.cpp", "unet_blocks.cpp", "allocation_cache.cpp")
]
_DISABLE = ("DENOISER_KERNELS", "DENOISER_FAST_GROUPNORM")  # the second: its name before the block ops
_lock = threading.Lock()
_state: dict[str, object] = {}  # "ok": bool once a load was attempted, "error": str when it failed


def _cpu_tag() -> str:
    """Short hash of this CPU's instruction-set flags: the kernels are built with -march=native, so a cached
    build must never be loaded on a CPU that lacks its instructions (e.g. a home folder shared by machines)."""
    try:
        flags = next(line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags"))
    except (OSError, StopIteration):
        flags = platform.processor() or platform.machine()
    return hashlib.sha1(flags.encode()).hexdigest()[:8]


def _put_ninja_on_path() -> None:
    """torch's builder runs `ninja` from PATH; the pip package's binary is not there unless the venv is
    activated (e.g. `.venv/bin/python -m pytest`)."""
    if shutil.which("ninja") is None:
        try:
            import ninja
        except ImportError:
            return
        os.environ["PATH"] = ninja.BIN_DIR + os.pathsep + os.environ.get("PATH", "")


def load_kernels() -> bool:
    """Compile (once per machine) and load the extension; False, with the reason logged, if it cannot.
    Called on every fast-path decision: once decided, it answers without the lock."""
    if "ok" in _state:
        return bool(_state["ok"])
    with _lock:
        if "ok" in _state:
            return bool(_state["ok"])
        disabled = [name for name in _DISABLE if os.environ.get(name, "1") == "0"]
        if disabled:
            _state.update(ok=False, error=f"disabled by {disabled[0]}=0")
            return False
        try:
            from torch.utils.cpp_extension import load

            _put_ninja_on_path()
            log.info("loading denoiser's C++ kernels (their first build on a machine takes about 15 s)")
            cflags = ["-O3", "-march=native", "-fopenmp", "-fno-math-errno", "-fno-trapping-math"]
            if platform.machine() in ("x86_64", "AMD64"):
                cflags.append("-mprefer-vector-width=512")  # gcc defaults to 256-bit vectors on AVX-512 CPUs
            load(
                name=f"denoiser_kernels_{_cpu_tag()}",
                sources=[str(s) for s in _SOURCES],
                extra_cflags=cflags,
                extra_ldflags=["-fopenmp"],
                is_python_module=False,
                verbose=False,
            )
            _state["ok"] = True
        except Exception as e:  # no compiler, no headers, ...: the reference paths still work
            _state.update(ok=False, error=f"{type(e).__name__}: {e}")
            log.warning(
                "denoiser: the C++ kernels could not be built (%s); using torch's GroupNorm and the modules' "
                "Python forward instead (same results, slower channels-last). They need a C++ compiler (g++) "
                "and ninja (a dependency of denoiser); set DENOISER_KERNELS=0 to skip the attempt.",
                _state["error"][-2000:],
            )
        return bool(_state["ok"])


def kernel_error() -> str | None:
    """Why the kernels are unavailable (None if they loaded or were never asked for)."""
    return _state.get("error")  # type: ignore[return-value]


@contextlib.contextmanager
def cached_cpu_allocations() -> Iterator[None]:
    """While open, CPU tensor memory that is freed is kept by size and handed out again instead of going
    back to the system (csrc/allocation_cache.cpp): a loop that allocates the same sizes every step then
    stops page-faulting its activations in afresh (~15% of a CPU sampling step). Nests; process-wide
    while open; the idle memory is released when the last one closes. A no-op without the kernels."""
    if not load_kernels():
        yield
        return
    torch.ops.denoiser.set_allocation_cache(True)
    try:
        yield
    finally:
        torch.ops.denoiser.set_allocation_cache(False)


_functorch_wrapped = getattr(getattr(torch._C, "_functorch", None), "is_functorch_wrapped_tensor", lambda t: False)


def plain_tensors(*tensors: torch.Tensor) -> bool:
    """Not under vmap/grad/jvp transforms and without forward-mode tangents: the kernels have no rules for
    those, so such tensors take the reference paths (which torch differentiates any way asked)."""
    if any(_functorch_wrapped(t) for t in tensors):
        return False
    if torch.autograd.forward_ad._current_level >= 0:  # inside a dual_level: tangents may exist
        return all(torch.autograd.forward_ad.unpack_dual(t).tangent is None for t in tensors)
    return True

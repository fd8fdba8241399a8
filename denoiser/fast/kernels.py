"""denoiser's C++ extension: built once at install (`denoiser build-kernels`, run by `make venv`), then
only loaded — never compiled on a user's call. Optional: without it everything runs on the reference
paths and only speed changes.

CPU sources (`denoiser/fast/csrc/`), each kept because an interleaved A/B showed it pays (bench/NOTES.md):
- `group_norm_nhwc.cpp`: GroupNorm (+ the SiLU that follows it) for channels-last tensors, forward and
  backward; used by `denoiser.fast.groupnorm`.
- `attention_small_head.cpp`: scaled dot-product attention for small heads (d = 16, 32) on fp32 CPU
  tensors, forward only; used by `denoiser.fast.attention`.
- `winograd_conv.cpp`: 3x3 convolutions by Winograd's F(4x4, 3x3) on fp32 channels-last CPU tensors, forward
  only; used by `denoiser.fast.winograd`.

The build is cached under ~/.cache/denoiser/kernels (or $DENOISER_KERNEL_CACHE) in a folder keyed by
the torch version, the compiler flags, this CPU's instruction-set flags (it is built -march=native)
and the sources, so a cached build is never loaded by another torch or on a CPU that lacks its
instructions. A build goes to a fresh temporary folder that is renamed into place when complete: a
killed build leaves no lock or half-written library behind. DENOISER_KERNELS=0 switches them off.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import platform
import shutil
import tempfile
import threading
from pathlib import Path

import torch

__all__ = ["build_kernels", "load_kernels", "kernel_error", "library_path", "plain_tensors", "tracing"]

log = logging.getLogger(__name__)

_CSRC = Path(__file__).parent / "csrc"
_SOURCES = [_CSRC / name for name in ("group_norm_nhwc.cpp", "attention_small_head.cpp", "winograd_conv.cpp")]
_HEADERS = sorted(_CSRC.glob("*.h"))
_DISABLE = ("DENOISER_KERNELS", "DENOISER_FAST_GROUPNORM")  # the second: an older name
_lock = threading.Lock()
_state: dict[str, object] = {}  # "ok": bool once a load was attempted, "error": str when it failed


def _cflags() -> list[str]:
    flags = ["-O3", "-march=native", "-fopenmp", "-fno-math-errno", "-fno-trapping-math"]
    if platform.machine() in ("x86_64", "AMD64"):
        flags.append("-mprefer-vector-width=512")  # gcc defaults to 256-bit vectors on AVX-512 CPUs
    return flags


def compile_flags() -> list[str]:
    """The C++ flags the kernels are built with: for building another revision's kernel beside them (an A/B)."""
    return _cflags()


@functools.cache
def cpuinfo() -> str:
    """/proc/cpuinfo, read once per process ("" where there is none: not Linux)."""
    try:
        return Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""


def _cpu_flags() -> str:
    line = next((line for line in cpuinfo().splitlines() if line.startswith("flags")), None)
    return line or platform.processor() or platform.machine()


@functools.cache
def _sources_digest(paths: tuple[Path, ...]) -> bytes:
    """The sources' contents, hashed once per process (they are read on every `library_path`)."""
    h = hashlib.sha1()
    for path in paths:
        h.update(path.name.encode() + b"\0" + path.read_bytes())
    return h.digest()


def _build_key() -> str:
    """What a build depends on: torch (its C++ ABI and headers), flags, the CPU's instructions, sources."""
    h = hashlib.sha1()
    for part in (torch.__version__, " ".join(_cflags()), _cpu_flags()):
        h.update(part.encode() + b"\0")
    h.update(_sources_digest(tuple(_SOURCES + _HEADERS)))
    return h.hexdigest()[:16]


def _cache_root() -> Path:
    default = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "denoiser" / "kernels"
    return Path(os.environ.get("DENOISER_KERNEL_CACHE", default))


def library_path() -> Path:
    """Where this machine's build lives (it may not exist yet)."""
    name = f"denoiser_kernels_{_build_key()}"
    return _cache_root() / name / f"{name}.so"


def _disabled() -> str | None:
    names = [name for name in _DISABLE if os.environ.get(name, "1") == "0"]
    return f"disabled by {names[0]}=0" if names else None


def build_kernels(verbose: bool = False) -> Path:
    """Compile the extension for this torch and CPU into the cache (about 30-150 s with g++) and return
    the library's path; an existing build is reused. Raises RuntimeError, saying what is missing, if it
    cannot be built."""
    target = library_path()
    if target.exists():
        return target
    from torch.utils.cpp_extension import load

    if shutil.which("ninja") is None:  # torch's builder runs `ninja`; the pip package's binary may be off PATH
        try:
            import ninja

            os.environ["PATH"] = ninja.BIN_DIR + os.pathsep + os.environ.get("PATH", "")
        except ImportError:
            pass
    target.parent.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".build-", dir=target.parent.parent))
    try:
        load(
            name=target.stem, sources=[str(s) for s in _SOURCES], extra_cflags=_cflags(), extra_ldflags=["-fopenmp"],
            build_directory=str(work), is_python_module=False, verbose=verbose,
        )  # fmt: skip
        try:
            work.rename(target.parent)
        except OSError:  # another process finished the same build first: keep theirs
            if not target.exists():
                raise
    except Exception as e:
        raise RuntimeError(
            f"denoiser's C++ kernels could not be built ({type(e).__name__}: {str(e)[-1500:]}); they need a C++ "
            "compiler (g++) and ninja (a dependency of denoiser). Everything still works on the reference paths."
        ) from e
    finally:
        shutil.rmtree(work, ignore_errors=True)
    _state.clear()  # a later load_kernels() sees the new build
    _state.update(ok=True)
    return target


def load_kernels() -> bool:
    """Load this machine's build if there is one (never compiles); False, with the reason kept for
    `kernel_error`, if there is none or it is switched off. Answers without the lock once decided."""
    if "ok" in _state:
        return bool(_state["ok"])
    with _lock:
        if "ok" in _state:
            return bool(_state["ok"])
        reason = _disabled()
        path = library_path()
        if reason is None and not path.exists():
            reason = f"not built for this torch and CPU (looked for {path})"
            log.warning(
                "denoiser: C++ kernels %s; using the reference paths (same results, slower). Build them once "
                "with `denoiser build-kernels` (`make venv` does).", reason,
            )  # fmt: skip
        if reason is None:
            try:
                torch.ops.load_library(str(path))
            except Exception as e:  # e.g. a library from a removed torch: the reference paths still work
                reason = f"{path} failed to load ({type(e).__name__}: {e}); rebuild with `denoiser build-kernels`"
                log.warning("denoiser: %s", reason)
        _state.update(ok=reason is None, error=reason)
        return reason is None


def kernel_error() -> str | None:
    """Why the kernels are unavailable (None if they loaded or were never asked for)."""
    return _state.get("error")  # type: ignore[return-value]


_functorch_wrapped = getattr(getattr(torch._C, "_functorch", None), "is_functorch_wrapped_tensor", lambda t: False)


def tracing() -> bool:
    """Whether torch.compile or torch.export is tracing the call: the graph then gets torch's own ops
    (the kernels and oneDNN packing are eager-only speed-ups) and no data-dependent Python checks."""
    return torch.compiler.is_compiling() or torch.compiler.is_exporting()


def plain_tensors(*tensors: torch.Tensor) -> bool:
    """Not under vmap/grad/jvp transforms and without forward-mode tangents: the kernels have no rules for
    those, so such tensors take the reference paths (which torch differentiates any way asked)."""
    if any(_functorch_wrapped(t) for t in tensors):
        return False
    if torch.autograd.forward_ad._current_level >= 0:  # inside a dual_level: tangents may exist
        return all(torch.autograd.forward_ad.unpack_dual(t).tangent is None for t in tensors)
    return True

"""glibc malloc settings for denoiser's processes, set with `mallopt` (nothing replaces the allocator).

Why: a CPU sampling step allocates the same activation sizes on every step. By default glibc serves
blocks of 128 KiB and more with mmap and unmaps them on free, so every step page-faults its
activations in afresh. Raising M_MMAP_THRESHOLD keeps such blocks in the heap, and raising
M_TRIM_THRESHOLD keeps freed heap memory for the next step instead of returning it at once
(bench/NOTES.md has the A/B). A server (the app) also caps the number of malloc arenas: glibc gives busy
threads arenas of their own, up to 8 per core, and memory freed in one arena is not reused by another,
so a server's RSS grows with the threads that ever sampled; `release_free_memory` hands free heap
memory back after a request.

glibc caps M_MMAP_THRESHOLD at 32 MiB, so a larger block is still mapped and unmapped on every use. A
training step at batch 32 of the DDPM-CIFAR10 U-Net has dozens of such activations and gradients (32 x 256 x
32 x 32 floats is 32 MiB) and page-faulted ~250,000 times a step, 7-10 % of its CPU time in the kernel.
`keep_peak=True` (the command line's batch commands: train, sample, evaluate, ...) also turns mmap off
(M_MMAP_MAX = 0) and keeps every freed byte (M_TRIM_THRESHOLD at its maximum), so the process holds its
peak and each step reuses the last step's pages: 0 page faults a step (bench/train_throughput.md). A
thread whose arena cannot grow that far still gets an mmap (glibc's fallback), so large allocations never
fail for it. Not for servers: their memory must go back after a request.

These are process-wide settings, so the program decides, never a library call: the CLI and the app
call `configure` once at start; a library user who samples in a loop may call it too. Without glibc
(macOS, Windows, musl) both functions do nothing and return False.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging

__all__ = ["configure", "release_free_memory"]

log = logging.getLogger(__name__)

# mallopt parameters (glibc's malloc.h)
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
M_ARENA_MAX = -8
M_MMAP_MAX = -4

MMAP_THRESHOLD = 32 << 20  # blocks up to 32 MiB from the heap: every activation of a 32x32 or 64x64 U-Net at batch 64
TRIM_THRESHOLD = 256 << 20  # keep up to 256 MiB of free heap for the next step (a DDPM-1000 x 64 step needs ~200 MiB)
KEEP_ALL = 2**31 - 1  # mallopt's largest value: free heap memory is never trimmed


@functools.cache
def _glibc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name or "libc.so.6")
        libc.mallopt.argtypes, libc.mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
        libc.malloc_trim.argtypes, libc.malloc_trim.restype = [ctypes.c_size_t], ctypes.c_int
    except (OSError, AttributeError):
        return None
    return libc if hasattr(libc, "gnu_get_libc_version") else None  # glibc only (musl's mallopt is a stub)


def configure(arena_max: int | None = None, keep_peak: bool = False) -> bool:
    """Keep freed activation memory in the heap for the next sampling step; arena_max caps malloc's
    arenas (for servers, e.g. 2); keep_peak serves every block from the heap and never trims it (a batch
    process: training, the command line). Returns whether every setting was accepted."""
    libc = _glibc()
    if libc is None:
        return False
    if keep_peak and arena_max is not None:
        raise ValueError("keep_peak is for batch processes and arena_max for servers: pass one of them")
    settings = [(M_MMAP_THRESHOLD, MMAP_THRESHOLD), (M_TRIM_THRESHOLD, KEEP_ALL if keep_peak else TRIM_THRESHOLD)]
    if keep_peak:
        settings.append((M_MMAP_MAX, 0))
    if arena_max is not None:
        if arena_max < 1:
            raise ValueError(f"arena_max must be at least 1, got {arena_max}")
        settings.append((M_ARENA_MAX, arena_max))
    ok = all(libc.mallopt(param, value) == 1 for param, value in settings)
    if not ok:
        log.warning("mallopt refused a setting (%s); sampling works, with more page faults", settings)
    return ok


def release_free_memory() -> bool:
    """Return free heap memory to the system (glibc's malloc_trim(0)); True if any was returned."""
    libc = _glibc()
    return libc is not None and libc.malloc_trim(0) == 1

"""The C++ extension: it builds here, can be switched off, and its caching CPU allocator."""

from __future__ import annotations

import torch

from denoiser import kernels
from denoiser.kernels import cached_cpu_allocations, load_kernels


def cache_state() -> tuple[int, int]:
    return tuple(torch.ops.denoiser.allocation_cache_state())


def test_kernels_build_here():
    # CI installs g++ (make test); without it everything still runs on the reference paths
    assert load_kernels(), kernels.kernel_error()


def test_disabled_by_environment(monkeypatch):
    monkeypatch.setattr(kernels, "_state", {})
    monkeypatch.setenv("DENOISER_KERNELS", "0")
    assert load_kernels() is False
    assert "DENOISER_KERNELS=0" in kernels.kernel_error()


def test_allocation_cache_reuses_freed_blocks_and_releases_them():
    assert cache_state() == (0, 0)
    with cached_cpu_allocations():
        a = torch.empty(1 << 20)  # 4 MiB
        ptr = a.data_ptr()
        del a
        assert cache_state() == (1, 4 << 20)  # kept, not returned to the system
        b = torch.empty(1 << 20)
        assert b.data_ptr() == ptr and cache_state() == (1, 0)  # the same block handed out again
        with cached_cpu_allocations():  # nests
            assert cache_state()[0] == 2
        kept = torch.ones(1000)
    assert cache_state() == (0, 0)  # uninstalled, idle blocks released
    b.fill_(2.0)  # blocks handed out stay valid after it is uninstalled and are freed normally
    assert kept.sum().item() == 1000.0 and b.sum().item() == 2.0 * (1 << 20)
    del b, kept
    assert cache_state() == (0, 0)


def test_allocation_cache_is_exception_safe():
    try:
        with cached_cpu_allocations():
            raise KeyError("boom")
    except KeyError:
        pass
    assert cache_state() == (0, 0)

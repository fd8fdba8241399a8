"""The C++ extension: built once at install, keyed to what it depends on, loaded without compiling."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch

from denoiser.fast import kernels
from denoiser.fast.kernels import build_kernels, kernel_error, library_path, load_kernels


@pytest.fixture
def empty_cache(tmp_path, monkeypatch):
    """A kernel cache with nothing in it, and a fresh load state (restored afterwards)."""
    monkeypatch.setenv("DENOISER_KERNEL_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(kernels, "_state", {})
    return tmp_path / "cache"


def test_kernels_are_built_here():
    # `make venv` runs `denoiser build-kernels` (CI installs g++); elsewhere the reference paths run
    assert load_kernels(), kernel_error()
    assert library_path().exists()


def test_disabled_by_environment(monkeypatch):
    monkeypatch.setattr(kernels, "_state", {})
    monkeypatch.setenv("DENOISER_KERNELS", "0")
    assert load_kernels() is False
    assert "DENOISER_KERNELS=0" in kernel_error()


def test_loading_never_compiles(empty_cache, monkeypatch):
    import torch.utils.cpp_extension

    def compiler(*args, **kwargs):
        raise AssertionError("load_kernels must not compile")

    monkeypatch.setattr(torch.utils.cpp_extension, "load", compiler)
    started = time.perf_counter()
    assert load_kernels() is False
    assert time.perf_counter() - started < 1.0
    assert "not built" in kernel_error() and str(empty_cache) in kernel_error()


def test_build_folder_is_keyed_by_torch_flags_cpu_and_sources(monkeypatch):
    base = library_path()
    assert base.stem in base.parent.name and base.name.endswith(".so")
    changes = {
        "torch": lambda: monkeypatch.setattr(torch, "__version__", "9.9.9"),
        "flags": lambda: monkeypatch.setattr(kernels, "_cflags", lambda: ["-O2"]),
        "cpu": lambda: monkeypatch.setattr(kernels, "_cpu_flags", lambda: "flags : sse2"),
        "sources": lambda: monkeypatch.setattr(kernels, "_HEADERS", kernels._HEADERS + [Path(kernels.__file__)]),
    }
    seen = {base}
    for name, change in changes.items():
        change()
        path = library_path()
        assert path not in seen, f"changing the {name} must change the build folder"
        seen.add(path)


def test_failed_build_says_what_is_missing_and_leaves_nothing(empty_cache, monkeypatch):
    import torch.utils.cpp_extension

    def no_compiler(name, sources, build_directory, **kwargs):
        (Path(build_directory) / "half-written.o").write_bytes(b"\0")
        raise OSError("g++: command not found")

    monkeypatch.setattr(torch.utils.cpp_extension, "load", no_compiler)
    with pytest.raises(RuntimeError, match="g\\+\\+: command not found.*need a C\\+\\+ compiler"):
        build_kernels()
    assert list(empty_cache.iterdir()) == []  # no lock, no half-built folder for the next build to trip on
    assert load_kernels() is False


def test_build_goes_into_place_whole_despite_a_killed_one(empty_cache, monkeypatch):
    import torch.utils.cpp_extension

    empty_cache.mkdir(parents=True)
    (empty_cache / ".build-killed").mkdir()  # what a killed build leaves: ignored
    (empty_cache / ".build-killed" / "lock").write_text("")
    built = []

    def fake_compiler(name, sources, build_directory, **kwargs):
        (Path(build_directory) / f"{name}.so").write_bytes(b"library")
        built.append(name)

    monkeypatch.setattr(torch.utils.cpp_extension, "load", fake_compiler)
    path = build_kernels()
    assert path == library_path() and path.read_bytes() == b"library" and len(built) == 1
    assert build_kernels() == path and len(built) == 1  # cached: not built again

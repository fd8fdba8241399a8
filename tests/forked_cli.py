"""`denoiser ...` in a fork of a process that has already imported the command line's packages (conftest.cli).

A `denoiser train` subprocess spends about 5 s importing torch, torchvision, diffusers and accelerate (the last two
import torch._dynamo) before a tiny run's 1 s of work, and tests/train/test_loop.py starts 27 of them. multiprocessing's fork
server imports those once per pytest worker; each command then runs in a fresh fork of it, with what a subprocess
gives the test: its own process, environment, working folder, stdout and stderr, and exit status.

The fork server's environment is fixed when it starts, and some settings are read at import (HF_HUB_OFFLINE,
DENOISER_KERNELS), so a command whose environment differs from the server's starts a new interpreter instead
(`run` returns None: the caller runs the subprocess). `run(..., python=True)` runs `python SCRIPT ...` or
`python -m MODULE ...` the same way (runpy, as the interpreter runs them): a bench script's --help in 0.1 s, not 6 s.
"""

from __future__ import annotations

import multiprocessing
import os
import runpy
import subprocess
import sys
import tempfile
from multiprocessing import forkserver

# what `denoiser train` imports before its work (the fork server imports them once)
PRELOAD = ["torch", "torchvision", "diffusers", "accelerate", "denoiser.cli.main", "denoiser.train.loop"]

RUNTIME_ONLY = {"PYTEST_CURRENT_TEST"}  # set by pytest for each test, read by nobody at import
_server_env: dict[str, str] | None = None


def _imported(env: dict[str, str]) -> dict[str, str]:
    """The part of an environment that modules may read when they are imported."""
    return {k: v for k, v in env.items() if k not in RUNTIME_ONLY}


def _enter(cwd: str, env: dict[str, str], out: str, err: str) -> None:
    """In the fork: the command's working folder and environment, its stdout and stderr to the files `out` and `err`."""
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    for fd, path in ((1, out), (2, err)):
        target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(target, fd)  # C code's output too (tqdm's bars, warnings)
        os.close(target)


def _python(argv: list[str], cwd: str, env: dict[str, str], out: str, err: str) -> None:
    """In the fork: `python *argv`, a script (`bench/x.py ...`) or a module (`-m denoiser.train ...`), as the
    interpreter runs it: run as __main__, its folder (a module: the working folder) first on sys.path."""
    _enter(cwd, env, out, err)
    try:
        if argv[0] == "-m":
            sys.argv = [argv[1], *argv[2:]]  # run_module puts the module's file in argv[0]
            sys.path.insert(0, cwd)
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        else:
            sys.argv = list(argv)
            sys.path.insert(0, os.path.dirname(os.path.abspath(argv[0])))
            runpy.run_path(argv[0], run_name="__main__")
    finally:
        sys.stdout.flush()
        sys.stderr.flush()


def _command(argv: list[str], cwd: str, env: dict[str, str], out: str, err: str) -> None:
    """In the fork: `python -m denoiser.cli.main *argv`, its stdout and stderr to the files `out` and `err`."""
    _enter(cwd, env, out, err)
    sys.argv = [os.path.join(cwd, "denoiser", "cli", "main.py"), *argv]
    try:
        from denoiser.cli.main import main

        code = main(argv)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
    sys.exit(code)


def run(argv: list[str], cwd: str, env: dict[str, str], timeout: float,
        python: bool = False) -> subprocess.CompletedProcess | None:
    """`denoiser *argv` (python: `python *argv`) in a fork of this worker's fork server (started at the first call,
    with `env`), or None when `env` is not the server's: the caller then starts a new interpreter."""
    global _server_env
    if _server_env is None:
        before = dict(os.environ)
        os.environ.clear()
        os.environ.update(env)  # the server starts with the command's environment (OMP_NUM_THREADS=1 included)
        try:
            forkserver.set_forkserver_preload(PRELOAD)
            forkserver.ensure_running()
        finally:
            os.environ.clear()
            os.environ.update(before)
        _server_env = _imported(env)
    if _imported(env) != _server_env:
        return None
    with tempfile.TemporaryDirectory(prefix="denoiser-cli-") as folder:
        out, err = os.path.join(folder, "stdout"), os.path.join(folder, "stderr")
        shown = ["python", *argv] if python else ["denoiser", *argv]
        process = multiprocessing.get_context("forkserver").Process(target=_python if python else _command,
                                                                    args=(argv, cwd, env, out, err))
        process.start()
        process.join(timeout)
        if process.exitcode is None:
            process.kill()
            process.join()
            raise subprocess.TimeoutExpired(shown, timeout)
        with open(out, encoding="utf-8", errors="replace") as o, open(err, encoding="utf-8", errors="replace") as e:
            return subprocess.CompletedProcess(shown, process.exitcode, o.read(), e.read())

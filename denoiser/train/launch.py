"""What `accelerate launch` asked for, and what to say when it started fewer processes than asked (the loop warns
once, at start-up): `accelerate launch --cpu --num_processes 2` starts one process."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["requested_processes", "launch_warning"]


def requested_processes(launcher_args: list[str]) -> int | None:
    """The process count an `accelerate launch` command line asks for (--num_processes N, --num-processes=N)."""
    for i, arg in enumerate(launcher_args):
        name, _, value = arg.partition("=")
        if name in ("--num_processes", "--num-processes"):
            value = value or (launcher_args[i + 1] if i + 1 < len(launcher_args) else "")
            return int(value) if value.isdigit() else None
    return None


def launch_warning(world: int, launcher_args: list[str] | None = None) -> str | None:
    """What to say when `accelerate launch` started fewer processes than asked: `--cpu --num_processes 2`
    starts one. The launcher is this process's parent; its command line says what was asked."""
    if launcher_args is None:
        try:
            raw = Path(f"/proc/{os.getppid()}/cmdline").read_bytes()
        except OSError:  # not Linux, or no parent to read: nothing to compare
            return None
        launcher_args = [a.decode(errors="replace") for a in raw.split(b"\0") if a]
    if not any("accelerate" in a for a in launcher_args[:3]):
        return None
    asked = requested_processes(launcher_args)
    if asked is None or asked <= world:
        return None
    fix = (f"`--cpu` starts one process whatever --num_processes says; for {asked} CPU processes run "
           f"`ACCELERATE_USE_CPU=true accelerate launch --multi_gpu --num_processes {asked} ...`"
           if "--cpu" in launcher_args else "check the devices accelerate can see (`accelerate env`)")
    return f"accelerate launch asked for {asked} processes but {world} started: {fix}"

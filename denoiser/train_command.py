"""The command line of a run: `denoiser train ...` (the CLI adds these flags to its `train` subcommand) and
`accelerate launch -m denoiser.train ...` (`main`), the same flags and the same behaviour; and what to say when the
launcher started fewer processes than asked. The loop itself is denoiser/train.py.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from accelerate import PartialState

from denoiser.config import load_config
from denoiser.fast import malloc

__all__ = ["add_train_arguments", "cmd_train", "main", "launch_warning", "requested_processes"]


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


def add_train_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of `denoiser train`, which `accelerate launch -m denoiser.train` takes as they are."""
    parser.add_argument("--config", required=True,
                        help="a preset name (tiny, cifar10, emoji, ...; a wrong name lists them) or a YAML file")
    parser.add_argument("--output-dir", default=None, help="run folder (default: runs/<config name>)")
    parser.add_argument("--max-steps", type=int, default=None, help="override train.max_steps")
    parser.add_argument("--resume", default=None, help="'latest' or a checkpoint folder")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a config value, e.g. --set train.lr=1e-4 (repeatable)")
    parser.add_argument("--overwrite", action="store_true", help="start over in an output folder that holds another run")
    parser.add_argument("--init-from", default=None, metavar="MODEL_DIR",
                        help="start from a model folder's weights (e.g. weights/cifar10): fresh optimizer, warm-up; fine-tuning")


def cmd_train(args: argparse.Namespace) -> None:
    """`denoiser train`: the config with its overrides, the run, then where its outputs are (main process)."""
    overrides = list(args.overrides) + ([f"train.max_steps={args.max_steps}"] if args.max_steps else [])
    cfg = load_config(args.config, overrides)
    out = args.output_dir or str(Path("runs") / Path(args.config).stem)
    from denoiser.train import train  # the loop imports this module for its re-exports

    model_dir = train(cfg, out, resume=args.resume, overwrite=args.overwrite, init_from=args.init_from)
    if PartialState().is_main_process:
        print(f"model: {model_dir}\nrun folder: {out} (samples/, loss.png, logs/ for tensorboard)")


def main(argv: list[str] | None = None) -> int:
    """`accelerate launch -m denoiser.train --config ...`: `denoiser train` as the `denoiser` command runs it
    (logging, malloc settings, errors as `denoiser train: error: ...` with exit status 2)."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    parser = argparse.ArgumentParser(prog="denoiser train")
    add_train_arguments(parser)
    args = parser.parse_args(argv)
    malloc.configure(keep_peak=True)  # every step reuses the last step's memory (denoiser/fast/malloc.py)
    try:
        cmd_train(args)
    except (ValueError, FileNotFoundError) as err:
        print(f"denoiser train: error: {err}", file=sys.stderr)
        return 2
    return 0

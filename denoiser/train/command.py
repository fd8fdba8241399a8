"""The command line of a run: `denoiser train ...` (the CLI adds these flags to its `train` subcommand) and
`accelerate launch -m denoiser.train ...` (`main`), the same flags and the same behaviour. The loop itself is
denoiser/train/loop.py.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from denoiser.fast import malloc

__all__ = ["add_train_arguments", "cmd_train", "main"]


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
    # imported here: `denoiser --help` and the flags load no torch (the config's modules import accelerate and
    # torchvision, ~5 s)
    from accelerate import PartialState

    from denoiser.train.config import load_config
    from denoiser.train.loop import train

    overrides = list(args.overrides) + ([f"train.max_steps={args.max_steps}"] if args.max_steps else [])
    cfg = load_config(args.config, overrides)
    out = args.output_dir or str(Path("runs") / Path(args.config).stem)

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


if __name__ == "__main__":
    sys.exit(main())

"""`denoiser train | sample | attention | attention-stats | evaluate | denoise | edit | inpaint | app | build-kernels`:
the command line (`denoiser app` hands its arguments to the web app's own parser; `accelerate launch -m denoiser.train`
and `python -m tools.emoji_text.emoji_set` read their own). Each command's flags sit beside its handler: sample and
attention in denoiser/cli/sample.py, denoise, edit and inpaint in restore.py, attention-stats and evaluate in
evaluate.py, the flags they share in common.py; train, prepare-data and build-kernels here."""

from __future__ import annotations

import argparse
import logging
import sys

from denoiser.cli import evaluate, restore, sample
from denoiser.cli.common import DEFAULT_MODEL

__all__ = ["main", "build_parser", "DEFAULT_MODEL"]


# command -> (help, the function that adds its flags, its handler): only the command being run gets its flags (and
# imports what they need), so `denoiser --help` loads nothing heavy (the handlers import torch when they run)
def _commands() -> dict:
    return {
        "train": ("train a UNet (also: accelerate launch -m denoiser.train ...)", _add_train_args, cmd_train),
        "sample": ("generate images into a PNG grid and/or one PNG per image", sample.add_sample_args, sample.cmd_sample),
        "attention": ("attention maps of one pixel at every attention layer", sample.add_attention_args,
                      sample.cmd_attention),
        "denoise": ("remove Gaussian noise from your image", restore.add_restore_args, restore.cmd_restore),
        "edit": ("SDEdit: re-imagine your image", restore.add_restore_args, restore.cmd_restore),
        "inpaint": ("regenerate the masked pixels of your image", restore.add_restore_args, restore.cmd_restore),
        "attention-stats": ("what each attention layer and head does over the noise levels: CSV + charts",
                            evaluate.add_attention_stats_args, evaluate.cmd_attention_stats),
        "evaluate": ("held-out bits/dim and per-timestep MSE, or FID, as JSON", evaluate.add_evaluate_args,
                     evaluate.cmd_evaluate),
        "prepare-data": ("decode a config's training images once into the shared store (a run does it on first use)",
                         _add_prepare_data_args, cmd_prepare_data),
        "app": ("serve the web app on 127.0.0.1 (`denoiser app --help`: its options)", None, None),
        "build-kernels": ("compile the optional C++ kernels for this torch and CPU (make venv runs it)", _add_kernel_args,
                          cmd_build_kernels),
    }


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser; `command` (default: every one) gets its arguments, the others only their help line."""
    p = argparse.ArgumentParser(prog="denoiser", description="Attention U-Net diffusion: train, sample, inspect.")
    sub = p.add_subparsers(dest="command", required=True)
    for name, (what, add_args, _) in _commands().items():
        sp = sub.add_parser(name, help=what, add_help=name != "app")
        if add_args is not None and command in (None, name):
            add_args(sp)
    return p


def _add_train_args(p: argparse.ArgumentParser) -> None:
    from denoiser.train.command import add_train_arguments  # shared with `accelerate launch -m denoiser.train`

    add_train_arguments(p)


def _add_kernel_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--verbose", action="store_true", help="show the compiler's output")


def _add_prepare_data_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", required=True, help="a preset name or a YAML file: its data section, at its model's sample_size")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config value, e.g. --set data.path=photos (repeatable)")


def cmd_prepare_data(args) -> None:
    import torch

    from denoiser.data import prepare
    from denoiser.model.unet import UNet
    from denoiser.train.config import load_config

    cfg = load_config(args.config, args.overrides)
    with torch.device("meta"):
        size = UNet(**cfg.model).config.sample_size
    info = prepare(cfg.data, size)
    print(f"store: {info.path}\nimages: {info.num_images} at {size}x{size} (prepared in {info.prepared_seconds} s)")
    if info.skipped:
        print(f"skipped {info.skipped} of {info.num_items} files: see {info.skipped_file}")


# the architecture the machine's precision is measured on at install: the shipped models' (weights/*/unet/config.json)
PRECISION_REFERENCE = dict(sample_size=32, base_channels=64, channel_mult=(1, 2, 2), layers_per_block=2,
                           attention_resolutions=(16, 8), mid_attention=True, num_heads=4, norm_num_groups=32,
                           num_class_embeds=10)


def cmd_build_kernels(args) -> None:
    """The kernels for this torch and CPU, then this machine's inference precision (denoiser.fast.precision), decided
    once with them, so that no first call pays for either."""
    import torch

    from denoiser.fast.kernels import build_kernels
    from denoiser.fast.precision import choose_precision, decision_path
    from denoiser.model.unet import UNet

    try:
        print(f"denoiser kernels: {build_kernels(verbose=args.verbose)}")
    except RuntimeError as err:  # no compiler: say so; everything still runs on the reference paths
        failed = err
    else:
        failed = None

    def reference() -> UNet:
        torch.manual_seed(0)
        return UNet(**PRECISION_REFERENCE).eval().to(memory_format=torch.channels_last)

    chosen = choose_precision(reference=reference)
    print(f"denoiser precision: {chosen.describe()}" + (f"; kept in {decision_path()}" if decision_path().exists() else ""))
    if failed is not None:
        raise ValueError(str(failed)) from failed


def cmd_train(args) -> None:
    from denoiser.train.command import cmd_train as run_training  # also `accelerate launch -m denoiser.train`'s entry

    run_training(args)


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["app"]:  # the web app parses its own arguments (`denoiser app --help`)
        from denoiser.app import main as app_main

        app_main(argv[1:])
        return 0
    args = build_parser(argv[0] if argv else None).parse_args(argv)
    from denoiser.fast import malloc

    malloc.configure(keep_peak=True)  # every step reuses the last step's memory (denoiser/fast/malloc.py)
    try:
        if hasattr(args, "model"):  # a folder, or a name under $DENOISER_WEIGHTS / a clone's weights/
            from denoiser.folders.model_dir import find_model

            args.model = str(find_model(args.model or DEFAULT_MODEL))
        _commands()[args.command][2](args)
    except (ValueError, FileNotFoundError) as err:
        print(f"denoiser {args.command}: error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""`denoiser train | sample | attention | attention-stats | evaluate | denoise | edit | inpaint | app | build-kernels`:
the command line (`denoiser app` hands its arguments to the web app's own parser; `accelerate launch -m denoiser.train`
and `python bench/emoji_text/emoji_set.py` read their own)."""

from __future__ import annotations

import argparse
import logging
import sys

from denoiser.request import BUILT_IN, PRECISIONS

__all__ = ["main", "build_parser"]


DEFAULT_MODEL = BUILT_IN["model"]  # found by name: $DENOISER_WEIGHTS, then a clone's weights/


def _pixel(text: str) -> tuple[int, int]:
    try:
        y, x = (int(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--pixel expects Y,X (two integers), got {text!r}") from None
    return y, x


def _add_sampling(p: argparse.ArgumentParser, what: str = "samples", images: bool = True) -> None:
    """The flags of a sampling request (denoiser.request.SampleRequest); unset ones come from the model folder
    (its scheduler/, sampling.json), else the built-in defaults."""
    from denoiser.request import BUILT_IN, SCHEDULERS, TIMESTEP_SPACINGS

    s = p.add_argument_group("sampling", f"how the {what} are sampled; unset: the model folder's own, else built in")
    if images:
        s.add_argument("--num-images", type=int, default=BUILT_IN["num_images"])
        s.add_argument("--batch-size", type=int, default=None,
                       help=f"images per UNet batch (speed and memory only, never the images; default "
                            f"{BUILT_IN['cpu_batch_size']} on the CPU, {BUILT_IN['batch_size']} on a GPU)")
    s.add_argument("--seed", type=int, default=0, help="image k is drawn from a generator seeded SEED + k")
    s.add_argument("--class-label", default=None,
                   help="class of a class-conditional model: a name (classes.txt) or index, a comma-separated one per "
                        "image, or 'spread' (0, 1, ..., K-1, 0, ...); unset: no class")
    s.add_argument("--prompt", default=None, help='a text model\'s prompt, e.g. "red apple" ("" or unset: no condition); '
                                                 '"(red:1.5) apple" weighs a word\'s attention (A1111\'s syntax)')
    s.add_argument("--negative-prompt", default=None, help="what a text model's guidance steers away from (default: \"\")")
    s.add_argument("--scheduler", default=None, choices=list(SCHEDULERS), help="default: the model folder's own (weights/cifar10: ddim, weights/emoji: unipc)")
    s.add_argument("--steps", type=int, default=None, help=f"sampling steps; default: the folder's sampling.json, else {BUILT_IN['steps']}")
    s.add_argument("--timestep-spacing", default=None, choices=list(TIMESTEP_SPACINGS),
                   help="which timesteps the sampler visits; default: the folder's (trailing suits few-step DDIM)")
    s.add_argument("--eta", type=float, default=0.0, help="DDIM's stochasticity (0 = deterministic)")
    _add_precision(s)
    _add_guidance(p, what)


def _add_precision(p: argparse.ArgumentParser) -> None:
    """--precision (denoiser.fast.precision): what the UNet calls run in; auto is this machine's decision, kept in a file."""
    p.add_argument("--precision", default="auto", choices=PRECISIONS,
                   help="what the UNet runs in: auto (default: this machine's, decided once by measurement, as "
                        "`denoiser build-kernels` prints it), float32, or bfloat16 (CPU autocast); the same flags give "
                        "the same pixels on the same machine")


def _add_guidance(p: argparse.ArgumentParser, what: str) -> None:
    """The guidance flags (denoiser.sampling.guidance); unset ones come from the model folder's sampling.json, else off."""
    g = p.add_argument_group("guidance", f"how the {what} are guided; unset: the model folder's sampling.json, else off")
    g.add_argument("--guidance-scale", "--guidance", type=float, default=None, dest="guidance_scale",
                   help="classifier-free guidance scale (class-conditional models with a class; 1 = off, 2-3 = clearer classes)")
    g.add_argument("--pag-scale", type=float, default=None,
                   help="perturbed-attention guidance: steer away from the model with attention switched to identity (0 = off)")
    g.add_argument("--pag-layers", default=None, metavar="NAMES",
                   help="comma-separated attention layers PAG perturbs (as `denoiser attention-stats` names them; default: the up path's first level, up.0.attn.*)")
    g.add_argument("--guide-model", default=None, metavar="FOLDER",
                   help="autoguidance: a smaller or less-trained model of the same data and classes")
    g.add_argument("--guide-scale", type=float, default=None, help="autoguidance weight (1 = off)")
    g.add_argument("--guidance-interval", type=float, nargs=2, default=None, metavar=("LO", "HI"),
                   help="apply the guidance only at timesteps LO..HI (one plain UNet pass at the others); "
                        "0 999 applies it at every step")


# command -> (help, the function that adds its arguments): only the command being run gets its arguments (and
# imports what they need), so `denoiser --help` loads nothing heavy
def _commands() -> dict:
    return {
        "train": ("train a UNet (also: accelerate launch -m denoiser.train ...)", _add_train_args),
        "sample": ("generate images into a PNG grid and/or one PNG per image", _add_sample_args),
        "attention": ("attention maps of one pixel at every attention layer", _add_attention_args),
        "denoise": ("remove Gaussian noise from your image", _add_restore_args),
        "edit": ("SDEdit: re-imagine your image", _add_restore_args),
        "inpaint": ("regenerate the masked pixels of your image", _add_restore_args),
        "attention-stats": ("what each attention layer and head does over the noise levels: CSV + charts",
                            _add_attention_stats_args),
        "evaluate": ("held-out bits/dim and per-timestep MSE, or FID, as JSON", _add_evaluate_args),
        "prepare-data": ("decode a config's training images once into the shared store (a run does it on first use)",
                         _add_prepare_data_args),
        "app": ("serve the web app on 127.0.0.1 (`denoiser app --help`: its options)", None),
        "build-kernels": ("compile the optional C++ kernels for this torch and CPU (make venv runs it)", _add_kernel_args),
    }


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser; `command` (default: every one) gets its arguments, the others only their help line."""
    p = argparse.ArgumentParser(prog="denoiser", description="Attention U-Net diffusion: train, sample, inspect.")
    sub = p.add_subparsers(dest="command", required=True)
    for name, (what, add_args) in _commands().items():
        sp = sub.add_parser(name, help=what, add_help=name != "app")
        if add_args is not None and command in (None, name):
            add_args(sp)
    return p


def _add_train_args(p: argparse.ArgumentParser) -> None:
    from denoiser.train.command import add_train_arguments  # shared with `accelerate launch -m denoiser.train`

    add_train_arguments(p)


def _add_kernel_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--verbose", action="store_true", help="show the compiler's output")


def _add_model(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None, help=f"model folder, or a name in $DENOISER_WEIGHTS / weights/; default: {DEFAULT_MODEL}")


def _add_sample_args(p: argparse.ArgumentParser) -> None:
    _add_model(p)
    p.add_argument("--out", default=None, help="the grid PNG")
    p.add_argument("--out-dir", default=None, help="one PNG per image: 000000.png, 000001.png, ... (image k: seed + k)")
    _add_sampling(p)
    p.add_argument("--trajectory", default=None, help="also write the denoising trajectory (x_t over x0) PNG here")
    p.add_argument("--trajectory-every", type=int, default=5)
    p.add_argument("--scale", type=int, default=4, help="upscale the grid (nearest) for viewing")
    _add_prompt_edit(p)


def _add_prompt_edit(p: argparse.ArgumentParser) -> None:
    """Prompt-to-prompt's flags (denoiser.sampling.prompt_to_prompt): the source --prompt and its edits, drawn from one noise."""
    from denoiser.request import DEFAULT_CROSS_REPLACE, DEFAULT_SELF_REPLACE, EDIT_TYPES

    e = p.add_argument_group("prompt-to-prompt", "change the words, keep the picture (text models): writes the --prompt's "
                                                 "image and one per --edit-to, all from the first image's noise")
    e.add_argument("--edit-to", action="append", default=None, metavar="PROMPT",
                   help='the edited prompt, e.g. --prompt "red heart" --edit-to "blue heart" (repeat for more edits)')
    e.add_argument("--edit-type", default="replace", choices=list(EDIT_TYPES),
                   help="replace: swap words one for one; refine: add or remove words; reweight: scale --equalizer-words")
    e.add_argument("--cross-replace-steps", type=float, default=DEFAULT_CROSS_REPLACE, metavar="F",
                   help="the first F of the steps take the source's word maps (cross-attention)")
    e.add_argument("--self-replace-steps", type=float, default=DEFAULT_SELF_REPLACE, metavar="F",
                   help="the first F of the steps take the source's layout (self-attention maps)")
    e.add_argument("--equalizer-words", default=None, metavar="WORDS", help="reweight: comma-separated words to scale")
    e.add_argument("--equalizer-strengths", default=None, metavar="W",
                   help="reweight: one factor for all the words, or comma-separated, one per word")


def _add_attention_args(p: argparse.ArgumentParser) -> None:
    _add_model(p)
    p.add_argument("--pixel", type=_pixel, default=None,
                   help="query pixel Y,X in image coordinates: its self-attention at every layer; on a text model also "
                        "its weights over the prompt's words (OUT-words.png)")
    p.add_argument("--word", default=None,
                   help="a word of --prompt (text models): its cross-attention map at every cross-attention layer")
    p.add_argument("--out", required=True, help="output PNG")
    p.add_argument("--at-step", type=int, default=None, help="sampling step to inspect (default: the last)")
    p.add_argument("--every-step", action="store_true",
                   help="with --word: one row per sampling step over that step's predicted x0 (rows = steps, columns = layers)")
    _add_sampling(p, "image", images=False)


def _add_restore_args(p: argparse.ArgumentParser) -> None:
    """denoise, edit and inpaint: one set of flags (denoiser.request.RestoreRequest), and each operation's own."""
    from denoiser.request import BUILT_IN

    name = p.prog.split()[-1]
    _add_model(p)
    p.add_argument("--image", required=True, help="input image (any size or mode, converted to RGB; a one-step denoise keeps "
                   "its size, in tiles; a sampled denoise, edit and inpaint resize and centre-crop it to the model's)")
    p.add_argument("--out", required=True, help="output PNG (one-step denoise: the image's own size; the others: the model's)")
    p.add_argument("--compare", default=None, help="also write input | result side by side (PNG)")
    p.add_argument("--steps", type=int, default=None, help=f"reverse-chain steps (default {BUILT_IN['steps']})")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--class-label", default=None, help="class index or name")
    _add_precision(p)
    _add_guidance(p, "restored images")
    p.add_argument("--add-noise", type=float, default=None, metavar="SIGMA",
                   help="add Gaussian noise of this std ([0, 1] pixel scale) first, to see the round trip (PSNR printed)")
    if name == "denoise":
        p.add_argument("--sigma", type=float, default=None, help="noise std of the input ([0, 1] scale); default: estimated")
        p.add_argument("--method", default="mmse", choices=("mmse", "sample"),
                       help="mmse: one x0 prediction (smooth, best PSNR); sample: the reverse chain (sharper)")
    if name == "edit":
        p.add_argument("--strength", type=float, default=None,
                       help=f"how far the image is noised before it is redrawn: near 0 keeps it, 1 samples anew "
                            f"(default {BUILT_IN['strength']})")
    if name == "inpaint":
        p.add_argument("--mask", required=True, help="mask image of the input's size: white = regenerate, black = keep")
    if name in ("edit", "inpaint"):  # what the redrawn pixels should show; denoising keeps the picture's own content
        p.add_argument("--prompt", default=None, help='a text model\'s prompt the redrawn pixels follow, e.g. "red apple" '
                       "(unset: no condition; guidance from the folder's sampling.json, as for sampling)")
        p.add_argument("--negative-prompt", default=None, help="what a text model's guidance steers away from (default: \"\")")


def _add_attention_stats_args(p: argparse.ArgumentParser) -> None:
    from denoiser.request import BUILT_IN

    _add_model(p)
    p.add_argument("--out-dir", required=True, help="folder for attention_stats.csv and attention_stats.png")
    p.add_argument("--images", default=None, metavar="FOLDER",
                   help="your images (a folder, searched recursively; resized and centre-cropped); default: generated ones")
    p.add_argument("--num-images", type=int, default=BUILT_IN["num_images"],
                   help=f"images in the batch (generated: {BUILT_IN['statistics_scheduler']}-{BUILT_IN['statistics_steps']} "
                        "from --seed, unguided)")
    p.add_argument("--timesteps", default=",".join(map(str, BUILT_IN["statistics_timesteps"])),
                   help="comma-separated noise levels t")
    p.add_argument("--no-heads", action="store_true", help="layers only (one ablation call per layer, not per head)")
    _add_precision(p)
    p.add_argument("--class-label", default="spread", help="class (index or name) of the generated images (default: spread evenly)")
    p.add_argument("--seed", type=int, default=0)


def _add_evaluate_args(p: argparse.ArgumentParser) -> None:
    from denoiser.request import BUILT_IN

    p.add_argument("--model", required=True)
    p.add_argument("--data", default=None, help="image folder (ImageFolder layout); default: the model's synthetic set")
    p.add_argument("--num-images", type=int, default=64, help="images evaluated (cost: T passes per image)")
    p.add_argument("--num-timesteps", type=int, default=None, help="evaluate a strided subset of timesteps (estimate)")
    p.add_argument("--val-size", type=int, default=None, help="use the validation split of this size (seeded) from --data")
    p.add_argument("--val-seed", type=int, default=0)
    p.add_argument("--batch-size", type=int, default=None,
                   help=f"images per batch (default 64; --fid's samples: as `denoiser sample`, "
                        f"{BUILT_IN['cpu_batch_size']} on the CPU)")
    p.add_argument("--fid", action="store_true",
                   help="FID of --num-samples generated images against --reference instead: the images `denoiser sample` "
                        "gives with the same flags (classes spread evenly unless --class-label says otherwise)")
    p.add_argument("--num-samples", type=int, default=1000, help="generated images for --fid (report FID-N with N)")
    p.add_argument("--prompts", default=None, metavar="FILE",
                   help="a text model's prompts, one per line, cycled over the images: the --fid samples' prompts, or the prompt "
                        "each --data image's bound is conditioned on (line k for image k: e.g. the held-out images' names)")
    p.add_argument("--reference", default=None, metavar="STATS.safetensors",
                   help="reference statistics for --fid; computed once from --data (its --val-size split) when missing")
    p.add_argument("--samples", default=None, metavar="IMAGES.npy",
                   help="score these uint8 (N, H, W, 3) images instead of sampling (e.g. from bench/gpu/run.sh)")
    _add_sampling(p, "--fid samples", images=False)
    p.set_defaults(class_label="spread")


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
    from denoiser.cli.evaluate import cmd_attention_stats, cmd_evaluate
    from denoiser.cli.restore import cmd_restore
    from denoiser.cli.sample import cmd_attention, cmd_sample

    handler = {"train": cmd_train, "sample": cmd_sample, "attention": cmd_attention, "evaluate": cmd_evaluate,
               "denoise": cmd_restore, "edit": cmd_restore, "inpaint": cmd_restore, "build-kernels": cmd_build_kernels,
               "attention-stats": cmd_attention_stats, "prepare-data": cmd_prepare_data}
    from denoiser.fast import malloc

    malloc.configure(keep_peak=True)  # every step reuses the last step's memory (denoiser/fast/malloc.py)
    try:
        if hasattr(args, "model"):  # a folder, or a name under $DENOISER_WEIGHTS / a clone's weights/
            from denoiser.folders.model_dir import find_model

            args.model = str(find_model(args.model or DEFAULT_MODEL))
        handler[args.command](args)
    except (ValueError, FileNotFoundError) as err:
        print(f"denoiser {args.command}: error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""`denoiser train | sample | attention | attention-stats | evaluate | denoise | edit | inpaint | app | build-kernels`:
the command line (`denoiser app` hands its arguments to the web app's own parser; `accelerate launch -m denoiser.train`
and `python -m denoiser.data.emoji_set` read their own)."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

logger = logging.getLogger("denoiser.cli")

__all__ = ["main", "build_parser"]


DEFAULT_MODEL = "synthetic-shapes"  # found by name: $DENOISER_WEIGHTS, then a clone's weights/


def _classes(text: str | None):
    """--class-label as the request's classes: a name or index for every image, "spread", or a comma-separated list."""
    if text is None or "," not in text:
        return text
    return [c.strip() for c in text.split(",") if c.strip()]


def _pixel(text: str) -> tuple[int, int]:
    try:
        y, x = (int(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--pixel expects Y,X (two integers), got {text!r}") from None
    return y, x


def _add_sampling(p: argparse.ArgumentParser, what: str = "samples", images: bool = True) -> None:
    """The flags of a sampling request (denoiser.request.SampleRequest); unset ones come from the model folder
    (its scheduler/, sampling.json), else the built-in defaults."""
    from denoiser.request import SCHEDULERS, TIMESTEP_SPACINGS

    s = p.add_argument_group("sampling", f"how the {what} are sampled; unset: the model folder's own, else built in")
    if images:
        s.add_argument("--num-images", type=int, default=16)
        s.add_argument("--batch-size", type=int, default=None, help="images per UNet batch (memory only: never the images)")
    s.add_argument("--seed", type=int, default=0, help="image k is drawn from a generator seeded SEED + k")
    s.add_argument("--class-label", default=None,
                   help="class of a class-conditional model: a name (classes.txt) or index, a comma-separated one per "
                        "image, or 'spread' (0, 1, ..., K-1, 0, ...); unset: no class")
    s.add_argument("--prompt", default=None, help='a text model\'s prompt, e.g. "red apple" ("" or unset: no condition); '
                                                 '"(red:1.5) apple" weighs a word\'s attention (A1111\'s syntax)')
    s.add_argument("--negative-prompt", default=None, help="what a text model's guidance steers away from (default: \"\")")
    s.add_argument("--scheduler", default=None, choices=list(SCHEDULERS), help="default: the model folder's own (weights/cifar10: ddim, weights/emoji: unipc)")
    s.add_argument("--steps", type=int, default=None, help="sampling steps; default: the folder's sampling.json, else 50")
    s.add_argument("--timestep-spacing", default=None, choices=list(TIMESTEP_SPACINGS),
                   help="which timesteps the sampler visits; default: the folder's (trailing suits few-step DDIM)")
    s.add_argument("--eta", type=float, default=0.0, help="DDIM's stochasticity (0 = deterministic)")
    _add_guidance(p, what)


def _add_guidance(p: argparse.ArgumentParser, what: str) -> None:
    """The guidance flags (denoiser.guidance); unset ones come from the model folder's sampling.json, else off."""
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


def _request(args, **fields):
    """The sampling request the flags of `_add_sampling` describe; `fields` set what the command fixes itself."""
    from denoiser.request import SampleRequest

    asked = dict(
        num_images=getattr(args, "num_images", 1), batch_size=getattr(args, "batch_size", None), seed=args.seed,
        classes=_classes(args.class_label), scheduler=getattr(args, "scheduler", None), steps=getattr(args, "steps", None),
        prompts=getattr(args, "prompt", None), negative_prompts=getattr(args, "negative_prompt", None),
        timestep_spacing=getattr(args, "timestep_spacing", None), eta=getattr(args, "eta", 0.0),
        guidance_scale=args.guidance_scale,
        pag_scale=args.pag_scale, pag_layers=args.pag_layers, guide_model=args.guide_model, guide_scale=args.guide_scale,
        guidance_interval=args.guidance_interval,
    )
    return SampleRequest(**{**asked, **fields})


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
    from denoiser.train import add_train_arguments  # shared with `accelerate launch -m denoiser.train`

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
    """Prompt-to-prompt's flags (denoiser.prompt_edit): the source --prompt and its edits, drawn from one noise."""
    from denoiser.prompt_edit import DEFAULT_CROSS_REPLACE, DEFAULT_SELF_REPLACE, EDIT_TYPES

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
    """denoise, edit and inpaint: one set of flags, and each operation's own."""
    name = p.prog.split()[-1]
    _add_model(p)
    p.add_argument("--image", required=True, help="input image (any size or mode, converted to RGB; denoise keeps its size, "
                   "edit and inpaint resize and centre-crop it to the model's)")
    p.add_argument("--out", required=True, help="output PNG (denoise: the image's own size; edit, inpaint: the model's)")
    p.add_argument("--compare", default=None, help="also write input | result side by side (PNG)")
    p.add_argument("--steps", type=int, default=50, help="reverse-chain steps")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--class-label", default=None, help="class index or name")
    _add_guidance(p, "restored images")
    p.add_argument("--add-noise", type=float, default=None, metavar="SIGMA",
                   help="add Gaussian noise of this std ([0, 1] pixel scale) first, to see the round trip (PSNR printed)")
    if name == "denoise":
        p.add_argument("--sigma", type=float, default=None, help="noise std of the input ([0, 1] scale); default: estimated")
        p.add_argument("--method", default="mmse", choices=("mmse", "sample"),
                       help="mmse: one x0 prediction (smooth, best PSNR); sample: the reverse chain (sharper)")
    if name == "edit":
        p.add_argument("--strength", type=float, default=0.6, help="0 keeps the image, 1 samples anew")
    if name == "inpaint":
        p.add_argument("--mask", required=True, help="mask image of the input's size: white = regenerate, black = keep")
    if name in ("edit", "inpaint"):  # what the redrawn pixels should show; denoising keeps the picture's own content
        p.add_argument("--prompt", default=None, help='a text model\'s prompt the redrawn pixels follow, e.g. "red apple" '
                       "(unset: no condition; guidance from the folder's sampling.json, as for sampling)")
        p.add_argument("--negative-prompt", default=None, help="what a text model's guidance steers away from (default: \"\")")


def _add_attention_stats_args(p: argparse.ArgumentParser) -> None:
    _add_model(p)
    p.add_argument("--out-dir", required=True, help="folder for attention_stats.csv and attention_stats.png")
    p.add_argument("--images", default=None, metavar="FOLDER",
                   help="your images (a folder, searched recursively; resized and centre-cropped); default: generated ones")
    p.add_argument("--num-images", type=int, default=8, help="images in the batch (generated: DDIM-25 from --seed)")
    p.add_argument("--timesteps", default=",".join(map(str, (999, 800, 600, 400, 250, 100, 30))),
                   help="comma-separated noise levels t")
    p.add_argument("--no-heads", action="store_true", help="layers only (one ablation call per layer, not per head)")
    p.add_argument("--class-label", default="spread", help="class (index or name) of the generated images (default: spread evenly)")
    p.add_argument("--seed", type=int, default=0)


def _add_evaluate_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True)
    p.add_argument("--data", default=None, help="image folder (ImageFolder layout); default: the model's synthetic set")
    p.add_argument("--num-images", type=int, default=64, help="images evaluated (cost: T passes per image)")
    p.add_argument("--num-timesteps", type=int, default=None, help="evaluate a strided subset of timesteps (estimate)")
    p.add_argument("--val-size", type=int, default=None, help="use the validation split of this size (seeded) from --data")
    p.add_argument("--val-seed", type=int, default=0)
    p.add_argument("--batch-size", type=int, default=None, help="images per batch (default 64)")
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

    from denoiser.config import load_config
    from denoiser.data import prepare
    from denoiser.unet import UNet

    cfg = load_config(args.config, args.overrides)
    with torch.device("meta"):
        size = UNet(**cfg.model).config.sample_size
    info = prepare(cfg.data, size)
    print(f"store: {info.path}\nimages: {info.num_images} at {size}x{size} (prepared in {info.prepared_seconds} s)")
    if info.skipped:
        print(f"skipped {info.skipped} of {info.num_items} files: see {info.skipped_file}")


def cmd_build_kernels(args) -> None:
    from denoiser.fast.kernels import build_kernels

    try:
        print(f"denoiser kernels: {build_kernels(verbose=args.verbose)}")
    except RuntimeError as err:  # no compiler: say so; everything still runs on the reference paths
        raise ValueError(str(err)) from err


def cmd_train(args) -> None:
    from denoiser.train import cmd_train as run_training  # also `accelerate launch -m denoiser.train`'s entry

    run_training(args)


def cmd_sample(args) -> None:
    from denoiser.image_io import save_grid, save_png, to_pil
    from denoiser.sample import trajectory_strip
    from denoiser.sampling import resolve, run

    if args.out is None and args.out_dir is None:
        raise ValueError("say where the images go: --out GRID.png, --out-dir FOLDER (one PNG per image), or both")
    plan = resolve(_request(args, **_edit_fields(args)), args.model)
    print(f"sampling {plan.num_images} image(s): {plan.describe()}")
    res = run(plan, trajectory_every=args.trajectory_every if args.trajectory else 0, progress=True)
    if args.trajectory:
        strip = trajectory_strip(res.trajectory)
        save_grid(strip, args.trajectory, nrow=strip.shape[0] // 2, scale=args.scale)
        print(f"trajectory: {args.trajectory} (top: x_t, bottom: predicted x0)")
    if args.out_dir:
        for k, image in enumerate(res.images):
            save_png(to_pil(image[None], padding=0), Path(args.out_dir) / f"{k:06d}.png")
        print(f"images: {args.out_dir}/000000.png ... {len(res.images) - 1:06d}.png")
    if args.out:
        print(f"samples: {save_grid(res.images, args.out, scale=args.scale)}")


def _edit_fields(args) -> dict:
    """The request's fields for `sample --edit-to`: the source prompt and its edits as the images, and the edit."""
    from denoiser.prompt_edit import PromptEdit

    if not args.edit_to:
        if args.equalizer_words or args.equalizer_strengths:
            raise ValueError("--equalizer-words/--equalizer-strengths belong to an edit: add --edit-to PROMPT and "
                             "--edit-type reweight")
        return {}
    if not args.prompt:
        raise ValueError('--edit-to edits a --prompt: give the source, e.g. --prompt "red heart" --edit-to "blue heart"')
    extra = {}
    if args.equalizer_words:
        extra["equalizer_words"] = [w.strip() for w in args.equalizer_words.split(",") if w.strip()]
    if args.equalizer_strengths:
        try:
            extra["equalizer_strengths"] = [float(w) for w in args.equalizer_strengths.split(",")]
        except ValueError:
            raise ValueError(f"--equalizer-strengths takes numbers, e.g. 2 or 2,0.5; got {args.equalizer_strengths!r}") from None
    edit = PromptEdit(args.edit_type, args.cross_replace_steps, args.self_replace_steps, **extra)
    prompts = [args.prompt, *args.edit_to]
    return {"prompts": prompts, "num_images": len(prompts), "edit": edit}


def _word_labels(plan) -> list[str]:
    """Image 0's words as the maps label them: a weighted word with its weight, as typed: "(red:1.5)"."""
    return [w if x == 1.0 else f"({w}:{x:g})" for w, x in zip(plan.words(0), plan.word_weights(0))]


def cmd_attention(args) -> None:
    from denoiser.sampling import resolve

    if (args.pixel is None) == (args.word is None):
        raise ValueError("say what to look at, one of: --pixel Y,X (one pixel's attention at every layer) or --word WORD "
                         "(a word of a text model's --prompt: its map at every cross-attention layer)")
    if args.every_step and (args.word is None or args.at_step is not None):
        raise ValueError("--every-step draws a --word's maps at every step: give --word, and leave out --at-step")
    plan = resolve(_request(args, num_images=1), args.model)
    at = plan.steps - 1 if args.at_step is None else args.at_step
    if not 0 <= at < plan.steps:
        raise ValueError(f"--at-step must be in 0..{plan.steps - 1}, got {at}")
    if args.word is not None:
        return _attention_word(args, plan, at)
    return _attention_pixel(args, plan, at)


def _attention_pixel(args, plan, at: int) -> None:
    """`attention --pixel`: the pixel's self-attention panel; on a text model also its weights over the words."""
    from denoiser.image_io import save_png
    from denoiser.sampling import run
    from denoiser.visualize import attention_panel, token_weights_panel

    size = plan.unet.config.sample_size
    y, x = args.pixel
    if not (0 <= y < size and 0 <= x < size):
        raise ValueError(f"--pixel {y},{x} is outside the {size}x{size} image; use 0..{size - 1}")
    res = run(plan, capture_steps=[at])
    records = res.attention[at]
    self_layers = sum(r.kind == "self" for r in records)
    panel = attention_panel(res.images[0], records, (y, x))
    print(f"attention: {save_png(panel, args.out)} ({self_layers} layers, step {at} of {plan.steps})")
    if plan.text is not None and plan.prompts[0]:
        words = _word_labels(plan)
        out = Path(args.out).with_name(f"{Path(args.out).stem}-words.png")
        save_png(token_weights_panel(res.images[0], records, (y, x), words), out)
        print(f"weights over the words {' '.join(words)!r}: {out} ({len(records) - self_layers} cross-attention layers)")


def _attention_word(args, plan, at: int) -> None:
    """`attention --word`: one prompt word's map at every cross-attention layer, at one step or every step."""
    from denoiser.image_io import save_png
    from denoiser.sampling import run
    from denoiser.visualize import find_word, word_maps_grid, word_maps_panel

    if plan.text is None:
        raise ValueError("--word picks a word of a text model's --prompt; this model takes no text "
                         "(it has no cross-attention): use --pixel Y,X")
    words = list(plan.words(0))
    if not words:
        raise ValueError(f'--word {args.word!r} needs a prompt that contains it, e.g. --prompt "red apple" --word apple')
    token = find_word(words, args.word)
    words = _word_labels(plan)  # the maps are the weighted attention: the label says by how much
    steps = range(plan.steps) if args.every_step else [at]
    res = run(plan, capture_steps=steps, trajectory_every=1 if args.every_step else 0)
    if args.every_step:  # each step's row over that step's predicted x0: where the object is forming
        rows = [(f"step {i} (t={t}): predicted x0", x0[0], res.attention[i]) for i, (t, _, x0) in enumerate(res.trajectory)]
        panel = word_maps_grid(rows, token, words[token])
    else:
        panel = word_maps_panel(res.images[0], res.attention[at], token, words[token])
    layers = sum(r.kind == "cross" for r in res.attention[at])
    when = f"{plan.steps} steps" if args.every_step else f"step {at} of {plan.steps}"
    print(f"word map of {words[token]!r} in {plan.prompts[0]!r}: {save_png(panel, args.out)} ({layers} cross-attention "
          f"layers, {when})")


def _read_image(path: str, what: str = "image", min_side: int | None = None):
    """An image file as RGB (denoiser.image_io: bounded memory, upright); errors name the file."""
    from denoiser.image_io import open_image

    return open_image(path, min_side=min_side, what=f"{what} {path!r}")


def cmd_restore(args) -> None:
    import torch

    from denoiser.diffusion import Diffusion
    from denoiser.image_io import save_grid
    from denoiser.model_dir import load_model
    from denoiser.pixels import to_unit
    from denoiser.restore import restore
    from denoiser.sampling import resolve

    unet, sched = load_model(args.model)
    size = unet.config.sample_size
    # the guidance and class as for sampling (the folder's sampling.json fills what is unset), checked before any work
    plan = resolve(_request(args, num_images=1, steps=None), args.model, unet=unet, scheduler=sched)
    if args.command == "denoise" and args.method == "mmse" and _image_size(args.image) != (size, size):
        return _denoise_at_own_size(args, plan, sched)  # any size: overlapping tiles (denoiser.tiles)
    img = _read_image(args.image, min_side=size)
    mask = _read_image(args.mask, "mask") if args.command == "inpaint" else None
    if img.size != (size, size):
        print(f"input resized and centre-cropped from {img.width}x{img.height} to {size}x{size} (the model's size)")
    own = {k: getattr(args, k) for k in ("method", "strength") if hasattr(args, k)}  # this subcommand's flags only
    res = restore(
        unet, Diffusion(sched), img, args.command, mask=mask, sigma=args.add_noise if getattr(args, "sigma", None) is None else args.sigma,
        noise_first=args.add_noise, steps=args.steps, seed=args.seed, class_label=plan.labels, guidance=plan.guidance,
        text=plan.text_condition([0]) if plan.prompts and plan.prompts[0] else None, **own,
    )
    print(f"{args.command}: {save_grid(res.result.images, args.out)}")
    if args.compare:
        shown = [to_unit(res.clean)] + ([to_unit(res.noisy)] if res.noisy is not None else []) + [res.result.images]
        save_grid(torch.cat(shown), args.compare, nrow=len(shown), scale=max(1, 128 // size))
        print(f"compare: {args.compare} (input{', noisy' if res.noisy is not None else ''}, result)")
    if res.noisy is not None:
        noisy_db, result_db = res.psnr()
        print(f"PSNR vs the clean input: noisy {noisy_db:.2f} dB, result {result_db:.2f} dB")


def _image_size(path: str) -> tuple[int, int]:
    """(width, height) of an image file, upright (a JPEG decoded at 1/8 scale to find it; errors name the file)."""
    return _read_image(path, min_side=1).info["source_size"]


def _denoise_at_own_size(args, plan, sched) -> None:
    """`denoise` (one-step MMSE) of a photo of any size (denoiser.tiles.denoise_photo), with the plan's class and
    guidance; the result at the photo's own size, the tiles' progress as a tqdm bar."""
    import torch
    from torchvision.transforms.functional import pil_to_tensor
    from tqdm.auto import tqdm

    from denoiser.image_io import save_png, uint8_to_pil
    from denoiser.tiles import denoise_photo

    photo = pil_to_tensor(_read_image(args.image))  # (3, H, W) uint8, the photo's own size
    sigma = args.sigma if args.sigma is not None else args.add_noise
    label = None if plan.labels is None else int(plan.labels[0])
    with tqdm(desc="denoise", unit="tile", dynamic_ncols=True) as bar:

        def progress(done: int, total: int) -> None:
            bar.total = total
            bar.update(done - bar.n)

        res = denoise_photo(plan.unet, sched, photo, sigma, noise_first=args.add_noise, seed=args.seed, class_label=label,
                            guidance=plan.guidance, progress=progress)
    size = plan.unet.config.sample_size
    print(f"denoise: {photo.shape[2]}x{photo.shape[1]} at its own size, in tiles of {size}x{size}: "
          f"{save_png(uint8_to_pil(res.result), args.out)}")
    if args.compare:
        shown = [photo] + ([res.noisy] if res.noisy is not None else []) + [res.result]
        save_png(uint8_to_pil(torch.cat(shown, dim=2)), args.compare)  # side by side, (3, H, k·W)
        print(f"compare: {args.compare} (input{', noisy' if res.noisy is not None else ''}, result)")
    if res.noisy is not None:
        noisy_db, result_db = res.psnr()
        print(f"PSNR vs the clean input: noisy {noisy_db:.2f} dB, result {result_db:.2f} dB")


def cmd_attention_stats(args) -> None:
    import torch

    from denoiser.attention_stats import attention_stats, stats_chart, write_csv
    from denoiser.image_io import image_to_model, save_png
    from denoiser.model_dir import load_model
    from denoiser.pixels import unit_to_model
    from denoiser.request import SampleRequest
    from denoiser.sampling import resolve, run

    try:
        timesteps = [int(t) for t in args.timesteps.split(",") if t.strip()]
    except ValueError:
        raise ValueError(f"--timesteps expects comma-separated integers, got {args.timesteps!r}") from None
    if not 1 <= args.num_images <= 256:
        raise ValueError(f"--num-images must be in 1..256, got {args.num_images}")
    unet, sched = load_model(args.model)
    n_cls = unet.config.num_class_embeds
    # the generated images: a fixed recipe (DDIM-25, no guidance), the classes asked for
    request = SampleRequest(num_images=args.num_images, classes=_classes(args.class_label) if n_cls else None,
                            seed=args.seed, scheduler="ddim", steps=25, guidance_scale=1.0, pag_scale=0.0, guide_scale=1.0)
    plan = resolve(request, args.model, unet=unet, scheduler=sched)
    labels = plan.labels
    if args.images:
        files = sorted(p for p in Path(args.images).rglob("*") if p.suffix.lower() in (".png", ".jpg", ".jpeg", ".webp"))
        if not files:
            raise ValueError(f"no .png/.jpg/.webp images under {args.images!r}")
        size = unet.config.sample_size
        images = torch.cat([image_to_model(_read_image(str(f), min_side=size), size) for f in files[: args.num_images]])
        labels = None if labels is None else labels[: len(images)].fill_(n_cls)  # the user's images: "no class"
        how = f"{len(images)} images from {args.images}"
    else:
        images = unit_to_model(run(plan).images)
        how = f"{args.num_images} generated images ({plan.describe()})"
    rows = attention_stats(unet, sched, images, labels, timesteps, heads=not args.no_heads, seed=args.seed)
    out = Path(args.out_dir)
    csv_path = write_csv(rows, out / "attention_stats.csv")
    png = save_png(stats_chart(rows), out / "attention_stats.png")
    print(f"attention stats of {how}: {csv_path} ({len(rows)} rows), charts {png}")
    layers = [r for r in rows if r.head == -1]
    top = sorted(layers, key=lambda r: -r.output_change)[:5]
    print("largest effects of switching a layer to identity (t, layer, output change, eps-MSE change):")
    for r in top:
        print(f"  t={r.timestep:4d} {r.layer:16s} {r.output_change:.4f} {r.eps_mse_delta:+.5f}")


def cmd_fid(args) -> None:
    import numpy as np
    import torch

    from denoiser.fid import InceptionFeatures, fid_of_images, reference_statistics
    from denoiser.model_dir import load_model
    from denoiser.pixels import to_uint8
    from denoiser.sampling import resolve, run

    if args.reference is None:
        raise ValueError("--fid needs --reference STATS.safetensors (with --data FOLDER to compute it the first time)")
    if args.num_samples < 2:
        raise ValueError(f"--num-samples must be at least 2 for a covariance, got {args.num_samples}")
    unet, sched = load_model(args.model)
    extractor = InceptionFeatures()
    ref = reference_statistics(args.reference, args.data, unet.config.sample_size, args.val_size or 0, args.val_seed, extractor)
    if args.samples:
        images = torch.from_numpy(np.load(args.samples)).permute(0, 3, 1, 2)[: args.num_samples]  # (N, H, W, 3) -> (N, 3, H, W)
        how = f"images from {args.samples}"
    else:  # the images `denoiser sample` gives with the same flags; the guide (if any) loads only to sample
        own = (unet, sched)  # loaded above; a guide model (if any) loads from its own folder
        load = lambda path: own if Path(path).resolve() == Path(args.model).resolve() else load_model(path)  # noqa: E731
        classes = _classes(args.class_label) if unet.config.num_class_embeds else None  # "spread" needs classes
        prompts = _prompts(args, unet, args.num_samples)
        fields = {"prompts": prompts} if prompts is not None else {}
        plan = resolve(_request(args, num_images=args.num_samples, classes=classes, **fields), args.model, load=load)
        images = to_uint8(run(plan, progress=True).images)
        how = f"{plan.describe()}, " + (f"prompts {args.prompts or repr(args.prompt)}" if unet.config.cross_attention_dim
                                        else f"classes {args.class_label}")
    size = images.shape[-1]
    if ref.image_size is not None and ref.image_size != size:
        logger.warning("the reference statistics are of %dx%d images and these are %dx%d: the FID also measures the "
                       "resolution gap; for a model's own score compute a reference at its size (a new --reference "
                       "path with --data FOLDER)", ref.image_size, ref.image_size, size, size)
    score = fid_of_images(images, ref, extractor)
    print(json.dumps({"fid": round(score, 3), "num_samples": len(images), "samples": how,
                      "reference": {"path": args.reference, "num_images": ref.num_images, "image_size": ref.image_size}},
                     indent=1))


def _prompts(args, unet, n: int) -> list[str] | None:
    """A text model's prompts for `n` images: --prompts FILE's lines cycled over the images (e.g. the held-out
    images' own names), else None (--prompt for all); None for a class model (its classes)."""
    if unet.config.cross_attention_dim is None:
        if args.prompts:
            raise ValueError("--prompts is for a text model; this one has classes (--class-label)")
        return None
    if not args.prompts:
        if args.prompt is None:
            raise ValueError("a text model's evaluation needs prompts: --prompts FILE (one per line, cycled over the "
                             "images; e.g. the validation images' names) or --prompt TEXT for all (\"\": no condition)")
        return None
    from denoiser.text import prompts_from_file

    return prompts_from_file(args.prompts, n)


def cmd_evaluate(args) -> None:
    if args.fid:
        return cmd_fid(args)
    import torch

    from denoiser.config import DataConfig
    from denoiser.data import load_dataset, make_synthetic, split
    from denoiser.diffusion import Diffusion
    from denoiser.model_dir import load_model

    unet, sched = load_model(args.model)
    size = unet.config.sample_size
    if args.data:
        ds = load_dataset(DataConfig(dataset="folder", path=args.data), size)
    else:
        ds = make_synthetic(max(args.num_images, 1), size, seed=10_000)  # a seed the training set does not use
    if args.val_size:
        _, ds = split(ds, args.val_size, args.val_seed)
    n = min(args.num_images, len(ds))
    x, labels = ds.batch(torch.arange(n))
    if not unet.config.num_class_embeds:
        labels = None
    text = {}
    if unet.config.cross_attention_dim:  # a text model: the bound given each image's prompt
        from denoiser.model_dir import require_text
        from denoiser.text import encode_prompts

        prompts = _prompts(args, unet, n) or [args.prompt] * n
        tokenizer, encoder = require_text(args.model)
        with torch.no_grad():
            states, mask = encode_prompts(tokenizer, encoder, prompts)
        text = {"encoder_hidden_states": states, "encoder_attention_mask": mask.bool()}  # (N, L, D), (N, L)
    res = Diffusion(sched).evaluate(unet, x, labels, batch_size=args.batch_size or 64, num_timesteps=args.num_timesteps,
                                    seed=args.seed, unet_kwargs=text)
    print(json.dumps(res.to_dict(), indent=1))


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["app"]:  # the web app parses its own arguments (`denoiser app --help`)
        from denoiser.app import main as app_main

        app_main(argv[1:])
        return 0
    args = build_parser(argv[0] if argv else None).parse_args(argv)
    handler = {"train": cmd_train, "sample": cmd_sample, "attention": cmd_attention, "evaluate": cmd_evaluate,
               "denoise": cmd_restore, "edit": cmd_restore, "inpaint": cmd_restore, "build-kernels": cmd_build_kernels,
               "attention-stats": cmd_attention_stats, "prepare-data": cmd_prepare_data}
    from denoiser.fast import malloc

    malloc.configure(keep_peak=True)  # every step reuses the last step's memory (denoiser/fast/malloc.py)
    try:
        if hasattr(args, "model"):  # a folder, or a name under $DENOISER_WEIGHTS / a clone's weights/
            from denoiser.model_dir import find_model

            args.model = str(find_model(args.model or DEFAULT_MODEL))
        handler[args.command](args)
    except (ValueError, FileNotFoundError) as err:
        print(f"denoiser {args.command}: error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

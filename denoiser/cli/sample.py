"""`denoiser sample` and `denoiser attention`: a sampling request from the flags (`denoiser.cli.common.sampling_request`),
run by denoiser.sampling.plan; `sample --edit-to` adds prompt-to-prompt's edits, `attention` draws a pixel's or a word's
maps."""

from __future__ import annotations

import argparse
from pathlib import Path

from denoiser.cli.common import add_model, add_sampling, sampling_request
from denoiser.request import DEFAULT_CROSS_REPLACE, DEFAULT_SELF_REPLACE, EDIT_TYPES, PromptEdit

__all__ = ["cmd_sample", "cmd_attention"]


def add_sample_args(p: argparse.ArgumentParser) -> None:
    add_model(p)
    p.add_argument("--out", default=None, help="the grid PNG")
    p.add_argument("--out-dir", default=None, help="one PNG per image: 000000.png, 000001.png, ... (image k: seed + k)")
    add_sampling(p)
    p.add_argument("--trajectory", default=None, help="also write the denoising trajectory (x_t over x0) PNG here")
    p.add_argument("--trajectory-every", type=int, default=5)
    p.add_argument("--scale", type=int, default=4, help="upscale the grid (nearest) for viewing")
    add_prompt_edit(p)


def add_prompt_edit(p: argparse.ArgumentParser) -> None:
    """Prompt-to-prompt's flags (denoiser.sampling.prompt_to_prompt): the source --prompt and its edits, drawn from one noise."""
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


def _pixel(text: str) -> tuple[int, int]:
    try:
        y, x = (int(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--pixel expects Y,X (two integers), got {text!r}") from None
    return y, x


def add_attention_args(p: argparse.ArgumentParser) -> None:
    add_model(p)
    p.add_argument("--pixel", type=_pixel, default=None,
                   help="query pixel Y,X in image coordinates: its self-attention at every layer; on a text model also "
                        "its weights over the prompt's words (OUT-words.png)")
    p.add_argument("--word", default=None,
                   help="a word of --prompt (text models): its cross-attention map at every cross-attention layer")
    p.add_argument("--out", required=True, help="output PNG")
    p.add_argument("--at-step", type=int, default=None, help="sampling step to inspect (default: the last)")
    p.add_argument("--every-step", action="store_true",
                   help="with --word: one row per sampling step over that step's predicted x0 (rows = steps, columns = layers)")
    add_sampling(p, "image", images=False)


def cmd_sample(args) -> None:
    from denoiser.image_io import save_grid, save_png, to_pil
    from denoiser.sampling.loop import trajectory_strip
    from denoiser.sampling.plan import resolve, run

    if args.out is None and args.out_dir is None:
        raise ValueError("say where the images go: --out GRID.png, --out-dir FOLDER (one PNG per image), or both")
    plan = resolve(sampling_request(args, **_edit_fields(args)), args.model)
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
    from denoiser.sampling.plan import resolve

    if (args.pixel is None) == (args.word is None):
        raise ValueError("say what to look at, one of: --pixel Y,X (one pixel's attention at every layer) or --word WORD "
                         "(a word of a text model's --prompt: its map at every cross-attention layer)")
    if args.every_step and (args.word is None or args.at_step is not None):
        raise ValueError("--every-step draws a --word's maps at every step: give --word, and leave out --at-step")
    plan = resolve(sampling_request(args, num_images=1), args.model)
    at = plan.steps - 1 if args.at_step is None else args.at_step
    if not 0 <= at < plan.steps:
        raise ValueError(f"--at-step must be in 0..{plan.steps - 1}, got {at}")
    if args.word is not None:
        return _attention_word(args, plan, at)
    return _attention_pixel(args, plan, at)


def _attention_pixel(args, plan, at: int) -> None:
    """`attention --pixel`: the pixel's self-attention panel; on a text model also its weights over the words."""
    from denoiser.image_io import save_png
    from denoiser.pictures import attention_panel, token_weights_panel
    from denoiser.sampling.plan import run

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
    from denoiser.model.text import find_word
    from denoiser.pictures import word_maps_grid, word_maps_panel
    from denoiser.sampling.plan import run

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

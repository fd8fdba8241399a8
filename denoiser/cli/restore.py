"""`denoiser denoise | edit | inpaint`: your image through denoiser.restore.plan (a one-step denoise keeps the image's
size, in tiles; the chains work at the model's size), the same request the app's Photo tab runs."""

from __future__ import annotations

import argparse

from denoiser.cli.common import add_guidance, add_model, add_precision, guidance_request, parse_classes, read_image
from denoiser.request import BUILT_IN, RestoreRequest

__all__ = ["cmd_restore", "restore_request"]


def add_restore_args(p: argparse.ArgumentParser) -> None:
    """denoise, edit and inpaint: one set of flags (denoiser.request.RestoreRequest), and each operation's own."""
    name = p.prog.split()[-1]
    add_model(p)
    p.add_argument("--image", required=True, help="input image (any size or mode, converted to RGB; a one-step denoise keeps "
                   "its size, in tiles; a sampled denoise, edit and inpaint resize and centre-crop it to the model's)")
    p.add_argument("--out", required=True, help="output PNG (one-step denoise: the image's own size; the others: the model's)")
    p.add_argument("--compare", default=None, help="also write input | result side by side (PNG)")
    p.add_argument("--steps", type=int, default=None, help=f"reverse-chain steps (default {BUILT_IN['steps']})")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--class-label", default=None, help="class index or name")
    add_precision(p)
    add_guidance(p, "restored images")
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


def restore_request(args):
    """The RestoreRequest the flags of `add_restore_args` describe."""
    return RestoreRequest(
        args.command, method=getattr(args, "method", "mmse"), sigma=getattr(args, "sigma", None),
        strength=getattr(args, "strength", None), add_noise=args.add_noise, steps=args.steps, seed=args.seed,
        classes=parse_classes(args.class_label), prompts=getattr(args, "prompt", None) or None,
        negative_prompts=getattr(args, "negative_prompt", None) or None, guidance=guidance_request(args),
        precision=args.precision,
    )


def cmd_restore(args) -> None:
    from tqdm.auto import tqdm

    from denoiser.folders.model_dir import load
    from denoiser.image_io import save_png
    from denoiser.restore.plan import read_photo, resolve_restore, run_restore

    request = restore_request(args)  # its fields checked before the model loads
    model = load(args.model)
    size = model.unet.config.sample_size
    img = read_photo(args.image, request, size, what=f"image {args.image!r}")  # the rule every door decodes by
    mask = read_image(args.mask, "mask") if args.command == "inpaint" else None
    plan = resolve_restore(request, model, img, mask)  # everything checked before any work
    if plan.tiled:
        print(f"{args.command}: {img.width}x{img.height} at its own size, in tiles of {size}x{size} ({plan.tiles()} tiles), "
              f"{plan.sampling.precision.describe()}")
    else:
        if img.size != (size, size):
            print(f"input resized and centre-cropped from {img.width}x{img.height} to {size}x{size} (the model's size)")
        print(f"{args.command}: {plan.steps} steps, {plan.sampling.precision.describe()}")
    with tqdm(desc=args.command, unit="tile" if plan.tiled else "step", dynamic_ncols=True) as bar:

        def progress(done: int, total: int) -> None:
            bar.total = total
            bar.update(done - bar.n)

        done = run_restore(plan, progress=progress, callback=lambda i, *_: progress(i + 1, plan.steps))
    print(f"{args.command}: {save_png(done.image, args.out)}")
    if args.compare:
        from PIL import Image

        shown = [done.input] + ([done.noisy] if done.noisy is not None else []) + [done.image]
        scale = 1 if plan.tiled else max(1, 128 // size)
        w, h = shown[0].width * scale, shown[0].height * scale
        side = Image.new("RGB", (w * len(shown), h))  # input | noisy | result, side by side
        for k, picture in enumerate(shown):
            side.paste(picture.resize((w, h), Image.Resampling.NEAREST), (k * w, 0))
        save_png(side, args.compare)
        print(f"compare: {args.compare} (input{', noisy' if done.noisy is not None else ''}, result)")
    if done.psnr is not None:
        print(f"PSNR vs the clean input: noisy {done.psnr[0]:.2f} dB, result {done.psnr[1]:.2f} dB")

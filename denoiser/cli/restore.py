"""`denoiser denoise | edit | inpaint`: your image through denoiser.restore.plan (a one-step denoise keeps the image's
size, in tiles; the chains work at the model's size), the same request the app's Photo tab runs."""

from __future__ import annotations

from denoiser.cli.common import guidance_request, parse_classes, read_image

__all__ = ["cmd_restore", "restore_request"]


def restore_request(args):
    """The RestoreRequest the flags of `denoiser.cli.main._add_restore_args` describe."""
    from denoiser.request import RestoreRequest

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

"""`denoiser denoise | edit | inpaint`: your image through denoiser.restore (denoise at the image's own size in tiles
when it is not the model's)."""

from __future__ import annotations

from denoiser.cli_common import read_image, sampling_request

__all__ = ["cmd_restore"]


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
    plan = resolve(sampling_request(args, num_images=1, steps=None), args.model, unet=unet, scheduler=sched)
    if args.command == "denoise" and args.method == "mmse" and _image_size(args.image) != (size, size):
        return _denoise_at_own_size(args, plan, sched)  # any size: overlapping tiles (denoiser.tiles)
    img = read_image(args.image, min_side=size)
    mask = read_image(args.mask, "mask") if args.command == "inpaint" else None
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
    return read_image(path, min_side=1).info["source_size"]


def _denoise_at_own_size(args, plan, sched) -> None:
    """`denoise` (one-step MMSE) of a photo of any size (denoiser.tiles.denoise_photo), with the plan's class and
    guidance; the result at the photo's own size, the tiles' progress as a tqdm bar."""
    import torch
    from torchvision.transforms.functional import pil_to_tensor
    from tqdm.auto import tqdm

    from denoiser.image_io import save_png, uint8_to_pil
    from denoiser.tiles import denoise_photo

    photo = pil_to_tensor(read_image(args.image))  # (3, H, W) uint8, the photo's own size
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

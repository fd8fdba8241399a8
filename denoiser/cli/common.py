"""What the commands share: the class flag read, the sampling request the flags describe (denoiser.request), and a
user's image read safely. The flags themselves are defined in denoiser/cli/main.py."""

from __future__ import annotations

__all__ = ["guidance_request", "parse_classes", "sampling_request", "read_image"]


def parse_classes(text: str | None):
    """--class-label as the request's classes: a name or index for every image, "spread", or a comma-separated list."""
    if text is None or "," not in text:
        return text
    return [c.strip() for c in text.split(",") if c.strip()]


def guidance_request(args):
    """The guidance the flags of `denoiser.cli.main._add_guidance` describe (each None where not given)."""
    from denoiser.request import GuidanceRequest

    return GuidanceRequest(guidance_scale=args.guidance_scale, pag_scale=args.pag_scale, pag_layers=args.pag_layers,
                           guide_model=args.guide_model, guide_scale=args.guide_scale,
                           guidance_interval=args.guidance_interval)


def sampling_request(args, **fields):
    """The sampling request the flags of `denoiser.cli.main._add_sampling` describe; `fields` set what the command fixes itself."""
    from denoiser.request import SampleRequest

    asked = dict(
        num_images=getattr(args, "num_images", 1), batch_size=getattr(args, "batch_size", None), seed=args.seed,
        classes=parse_classes(args.class_label), scheduler=getattr(args, "scheduler", None), steps=getattr(args, "steps", None),
        prompts=getattr(args, "prompt", None), negative_prompts=getattr(args, "negative_prompt", None),
        timestep_spacing=getattr(args, "timestep_spacing", None), eta=getattr(args, "eta", 0.0),
        guidance=guidance_request(args), precision=getattr(args, "precision", None),
    )
    return SampleRequest(**{**asked, **fields})


def read_image(path: str, what: str = "image", min_side: int | None = None):
    """An image file as RGB (denoiser.image_io: bounded memory, upright); errors name the file."""
    from denoiser.image_io import open_image

    return open_image(path, min_side=min_side, what=f"{what} {path!r}")

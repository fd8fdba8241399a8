"""What the commands share: the flags of a model, a sampling request, its guidance and precision, each beside the
function that reads them into the request (denoiser.request); the class flag read; a user's image read safely. Each
command's own flags sit beside its handler (denoiser/cli/sample.py, restore.py, evaluate.py)."""

from __future__ import annotations

import argparse

from denoiser.request import BUILT_IN, PRECISIONS, SCHEDULERS, TIMESTEP_SPACINGS, GuidanceRequest, SampleRequest

__all__ = ["DEFAULT_MODEL", "add_model", "add_sampling", "add_guidance", "add_precision", "guidance_request", "parse_classes",
           "sampling_request", "read_image"]

DEFAULT_MODEL = BUILT_IN["model"]  # found by name: $DENOISER_WEIGHTS, then a clone's weights/


def add_model(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None, help=f"model folder, or a name in $DENOISER_WEIGHTS / weights/; default: {DEFAULT_MODEL}")


def add_sampling(p: argparse.ArgumentParser, what: str = "samples", images: bool = True) -> None:
    """The flags of a sampling request (denoiser.request.SampleRequest); unset ones come from the model folder
    (its scheduler/, sampling.json), else the built-in defaults."""
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
    add_precision(s)
    add_guidance(p, what)


def add_precision(p: argparse.ArgumentParser) -> None:
    """--precision (denoiser.fast.precision): what the UNet calls run in; auto is this machine's decision, kept in a file."""
    p.add_argument("--precision", default="auto", choices=PRECISIONS,
                   help="what the UNet runs in: auto (default: this machine's, decided once by measurement, as "
                        "`denoiser build-kernels` prints it), float32, or bfloat16 (CPU autocast); the same flags give "
                        "the same pixels on the same machine")


def add_guidance(p: argparse.ArgumentParser, what: str) -> None:
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


def parse_classes(text: str | None):
    """--class-label as the request's classes: a name or index for every image, "spread", or a comma-separated list."""
    if text is None or "," not in text:
        return text
    return [c.strip() for c in text.split(",") if c.strip()]


def guidance_request(args):
    """The guidance the flags of `add_guidance` describe (each None where not given)."""
    return GuidanceRequest(guidance_scale=args.guidance_scale, pag_scale=args.pag_scale, pag_layers=args.pag_layers,
                           guide_model=args.guide_model, guide_scale=args.guide_scale,
                           guidance_interval=args.guidance_interval)


def sampling_request(args, **fields):
    """The sampling request the flags of `add_sampling` describe; `fields` set what the command fixes itself."""
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

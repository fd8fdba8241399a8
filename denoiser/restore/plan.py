"""One way to restore a user's picture: a `RestoreRequest` resolved against a loaded model into a `RestorePlan`, and
`run_restore(plan)`, as sampling has `resolve` and `run` (denoiser.sampling.plan).

    model = load("weights/cifar10")
    plan = resolve_restore(RestoreRequest("denoise", add_noise=0.1, classes="cat"), model, Image.open("cat.jpg"))
    done = run_restore(plan)  # done.image: the result at the photo's size; done.settings: what ran

Where a restore works is one rule (`RestoreRequest.tiled`): a one-step denoise ("mmse") keeps the photo's size, in
overlapping tiles at the model's size (denoiser.restore.tiles), whatever the photo's size and whether noise is added first;
every chain (a denoise by sampling, an edit, an inpaint) works on the centre square at the model's size
(denoiser.restore.chains). The class, prompt and guidance are resolved as for sampling and reach both. A photo over
`max_pixels` (the app's work budget) is restored as a copy scaled down to fit, and the result says so.

The CLI (`denoiser denoise | edit | inpaint`), the app's Photo tab (through its engine, which adds the cache and the
budget) and the tests call these two functions; the same request gives the same pixels from each.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from PIL import Image
from torchvision.transforms.functional import pil_to_tensor

from denoiser.diffusion import Diffusion
from denoiser.fast.precision import running
from denoiser.folders.model_dir import LoadedModel, load
from denoiser.image_io import flatten_to_rgb, mask_to_model, open_image, uint8_to_pil
from denoiser.pixels import to_uint8, to_unit
from denoiser.request import BUILT_IN, METHODS, OPERATIONS, RestoreRequest, SampleRequest
from denoiser.restore.chains import restore
from denoiser.restore.tiles import count_tiles, denoise_photo
from denoiser.sampling.loop import SampleResult
from denoiser.sampling.plan import Plan, resolve

__all__ = ["RestorePlan", "RestoreResult", "read_photo", "scaled_size", "resolve_restore", "run_restore", "check_request", "takes_prompt", "chain_steps",
           "check_size", "MIN_SIDE"]

ScaledTo = tuple[int, int]


MIN_SIDE = 8  # pixels: a smaller picture has too little to restore (and 1 pixel a side breaks the noise estimate)


def check_size(width: int, height: int) -> None:
    """Refuse, before any work, a picture too small to restore, saying its size and what would do."""
    if min(width, height) < MIN_SIDE:
        raise ValueError(f"the picture is {width}x{height} pixels, too small to restore: use one at least {MIN_SIDE} "
                         f"pixels a side")


def takes_prompt(operation: str) -> bool:
    """Whether a restore operation follows a text model's prompt: edit and inpaint redraw pixels; a denoise keeps
    what the picture shows."""
    return operation in ("edit", "inpaint")


def chain_steps(request: RestoreRequest) -> int:
    """The timesteps a restore visits (at most; a small σ visits fewer): one for a one-step denoise, strength·steps
    for an edit, `steps` for a sampled denoise or an inpaint (the request's defaults filled in)."""
    if request.tiled:
        return 1
    if request.operation == "edit":
        return max(1, round(request.steps * request.strength))
    return request.steps


@dataclass
class RestorePlan:
    """A restore resolved for one model: everything `run_restore` needs, checked, nothing left to look up."""

    request: RestoreRequest  # every default filled in: what runs
    model: LoadedModel
    sampling: Plan  # the class, prompt and guidance, resolved as for sampling (one image)
    image: Image.Image  # the picture that runs, RGB: the photo (a scaled copy when it was over max_pixels)
    mask: Image.Image | None  # inpaint's: white or opaque painted pixels are regenerated
    source_size: tuple[int, int]  # (width, height) of the picture as given
    scaled_to: ScaledTo | None = None  # (width, height) of the copy a photo over max_pixels was scaled to

    @property
    def tiled(self) -> bool:
        return self.request.tiled

    @property
    def steps(self) -> int:
        return chain_steps(self.request)

    def tiles(self) -> int:
        """UNet images the tiled denoise takes (0 for a chain)."""
        return count_tiles(self.model.unet, self.image.height, self.image.width) if self.tiled else 0

    def settings(self) -> dict:
        """What runs, as a result's PNG records it: the filled-in request (only the fields its operation uses), the
        class by name, the prompt, and the sizes."""
        r = self.request
        s = {"operation": r.operation, "method": r.method, "steps": r.steps, "seed": r.seed,
             "guidance_scale": self.sampling.guidance.scale, "pag_scale": self.sampling.guidance.pag_scale,
             "sigma": r.sigma, "add_noise": r.add_noise or 0.0, "class": self.sampling.class_name(0),
             "chain": not self.tiled, "size": list(self.image.size) if self.tiled else [self.model.unet.config.sample_size] * 2,
             "precision": self.sampling.precision.name}
        if r.operation == "edit":
            s["strength"] = r.strength
        if r.prompts:
            s["prompt"] = r.prompts
        if r.negative_prompts:
            s["negative_prompt"] = r.negative_prompts
        if self.scaled_to is not None:
            s["scaled_from"] = list(self.source_size)
        return s


@dataclass
class RestoreResult:
    """What a restore did: pictures at the output's size (the photo's for tiles, the model's for a chain)."""

    image: Image.Image  # the result
    input: Image.Image  # what was restored, in the result's framing: the photo, or its centre square at the model's size
    noisy: Image.Image | None  # the input with the added noise (the round trip), or None
    psnr: tuple[float, float] | None  # (noisy, result) in dB against the input, when noise was added
    sigma: float | None  # the noise σ a denoise removed ([0, 1] pixel scale: the one given, or estimated)
    settings: dict  # what ran (RestorePlan.settings, plus the σ removed)
    source_size: tuple[int, int] = (0, 0)  # (width, height) of the picture as given
    model_size: int = 0  # the model's sample size: the tiles' side, the chain's square
    steps: int = 1  # timesteps the chain visited (1: a one-step denoise)
    tiles: int = 0  # UNet images a tiled denoise took (0: a chain)
    sample: SampleResult | None = None  # a chain's (images in [0, 1]; the app's attention views open it); None: tiles


def scaled_size(width: int, height: int, max_pixels: float) -> tuple[int, int]:
    """The size of the copy a photo over `max_pixels` is restored as: its shape kept, at most that many pixels."""
    if width * height <= max_pixels:
        return width, height
    scale = (max_pixels / (width * height)) ** 0.5
    return max(1, int(width * scale)), max(1, int(height * scale))


def read_photo(source, request: RestoreRequest, sample_size: int, max_pixels: float | None = None,
               what: str = "the photo") -> Image.Image:
    """A person's picture file, decoded by the one rule every door uses (the command line and the app's Photo tab),
    so the same file gives the model the same pixels: a tiled denoise reads the photo at its own size (at least
    `max_pixels` of its pixels where a budget caps it: a JPEG over it decodes at a reduced scale); a chain, which
    works on the centre square at the model's size, reads a JPEG at the smallest scale whose short side keeps
    `sample_size`. Upright (EXIF), bounded memory, its own size in `.info["source_size"]` (denoiser.image_io)."""
    if request.tiled:
        return open_image(source, keep_pixels=max_pixels, what=what)
    return open_image(source, min_side=sample_size, what=what)


def resolve_restore(
    request: RestoreRequest, model: LoadedModel | str | Path, image: Image.Image, mask: Image.Image | None = None, *,
    max_pixels: int | None = None, empty_mask_ok: bool = True,
    load: Callable[[Path], LoadedModel] = load,
) -> RestorePlan:
    """`request` for `model` (loaded, or its folder) and the user's picture, checked before any work; the defaults
    from `denoiser.request.BUILT_IN`, the guidance a class or prompt gets from the model's sampling.json.

    max_pixels: a tiled photo over this many pixels is restored as a copy scaled down to fit (the app's work
    budget); None: any size. empty_mask_ok=False refuses a mask that marks nothing (the app: nothing painted).
    load: how a folder and autoguidance's guide are loaded (the app's is cached).
    """
    r = check_request(request)
    if isinstance(model, (str, Path)):
        model = load(Path(model))
    if not isinstance(image, Image.Image):
        raise TypeError(f"image must be a PIL image, got {type(image).__name__}")
    if r.operation == "inpaint":
        if mask is None:
            raise ValueError("inpaint needs a mask: paint (or pass a mask image of) the area to regenerate")
        if not empty_mask_ok and not mask_to_model(mask, image.size, model.unet.config.sample_size).any():
            raise ValueError("the mask is empty: paint the area to regenerate")
    if model.text is not None and not r.prompts and r.guidance.guidance_scale not in (None, 1.0):
        raise ValueError("this is a text model: without a prompt it runs unconditioned, where classifier-free guidance "
                         "has nothing to steer by: give a prompt (edit, inpaint) or set guidance to 1")
    sampling = resolve(SampleRequest(num_images=1, classes=r.classes, prompts=r.prompts, negative_prompts=r.negative_prompts,
                                     seed=r.seed, guidance=r.guidance, precision=r.precision), model, load=load)
    source_size = tuple(image.info.get("source_size", image.size))  # a file's own size (decoded smaller, or not)
    check_size(*image.size)
    picture = flatten_to_rgb(image)
    if r.tiled and max_pixels is not None and image.width * image.height > max_pixels:
        picture = picture.resize(scaled_size(image.width, image.height, max_pixels), Image.Resampling.LANCZOS)
    scaled_to = picture.size if r.tiled and picture.size != source_size else None
    r = dataclasses.replace(r, guidance=dataclasses.replace(  # what ran, for the result's settings
        r.guidance, guidance_scale=sampling.guidance.scale, pag_scale=sampling.guidance.pag_scale,
        guide_scale=sampling.guidance.guide_scale))
    return RestorePlan(r, model, sampling, picture, mask, source_size, scaled_to)


def run_restore(
    plan: RestorePlan, *, callback: Callable[[int, int, torch.Tensor, torch.Tensor], None] | None = None,
    progress: Callable[[int, int], None] | None = None, should_stop: Callable[[], bool] | None = None,
    out: torch.Tensor | None = None,
) -> RestoreResult:
    """Run the plan: tiles at the photo's size, or the chain on the centre square (RestoreRequest.tiled).

    callback(i, t, x_t, x0): a chain's every step (denoiser.sampling.loop.sample). progress(done, total), should_stop() and
    out (a (3, H, W) uint8 buffer the rows are written into as they finish): the tiles' (denoiser.restore.tiles).
    Every UNet call runs in the plan's precision, chosen once when it was resolved.
    """
    with running(plan.sampling.precision):
        return _run(plan, callback, progress, should_stop, out)


def _run(plan: RestorePlan, callback, progress, should_stop, out) -> RestoreResult:
    """`run_restore` in the plan's precision."""
    r, unet, scheduler = plan.request, plan.model.unet, plan.model.noise_schedule
    label = None if plan.sampling.labels is None else int(plan.sampling.labels[0])
    if plan.tiled:
        photo = pil_to_tensor(plan.image)  # (3, H, W) uint8
        done = denoise_photo(unet, scheduler, photo, r.sigma, add_noise=r.add_noise, seed=r.seed, class_label=label,
                             guidance=plan.sampling.guidance, progress=progress, should_stop=should_stop, out=out)
        noisy = None if done.noisy is None else uint8_to_pil(done.noisy)
        return RestoreResult(uint8_to_pil(done.result), plan.image, noisy, done.psnr(), done.sigma,
                             {**plan.settings(), "sigma_removed": round(done.sigma, 4)}, plan.source_size,
                             unet.config.sample_size, tiles=plan.tiles())
    text = plan.sampling.text_condition([0]) if r.prompts else None
    visited = []

    def step(i: int, t: int, x_t: torch.Tensor, x0: torch.Tensor) -> None:
        visited.append(t)
        if callback is not None:
            callback(i, t, x_t, x0)

    res = restore(unet, Diffusion(scheduler), plan.image, r.operation, mask=plan.mask, sigma=r.sigma, method=r.method,
                  strength=r.strength, add_noise=r.add_noise, steps=r.steps, seed=r.seed,
                  class_label=plan.sampling.labels, guidance=plan.sampling.guidance, callback=step, text=text)
    noisy = None if res.noisy is None else _pil(to_unit(res.noisy))
    sigma = None if res.sigma is None else round(res.sigma, 4)
    return RestoreResult(_pil(res.result.images), _pil(to_unit(res.clean)), noisy, res.psnr(), res.sigma,
                         {**plan.settings(), "sigma_removed": sigma}, plan.source_size, unet.config.sample_size,
                         steps=len(visited), sample=res.result)


def check_request(request: RestoreRequest) -> RestoreRequest:
    """The request checked field by field, before any model or picture is read, its defaults (BUILT_IN) filled in."""
    if not isinstance(request, RestoreRequest):
        raise TypeError(f"pass a denoiser.request.RestoreRequest, got {type(request).__name__}")
    r = request
    if r.operation not in OPERATIONS:
        raise ValueError(f"operation must be one of {', '.join(OPERATIONS)}, got {str(r.operation)[:40]!r}")
    if r.method not in METHODS:
        raise ValueError(f"method must be 'mmse' (one x₀ prediction) or 'sample' (the reverse chain), got {r.method!r}")
    steps = BUILT_IN["steps"] if r.steps is None else r.steps
    strength = BUILT_IN["strength"] if r.strength is None else r.strength
    if not isinstance(steps, int) or isinstance(steps, bool) or not 1 <= steps <= 1000:
        raise ValueError(f"steps must be a whole number in 1..1000, got {steps!r}")
    if not isinstance(r.seed, int) or r.seed < 0:
        raise ValueError(f"seed must be a whole number >= 0, got {r.seed!r}")
    for name, value, lo in (("noise σ", r.sigma, 0.0), ("added noise σ", r.add_noise, 0.0), ("strength", strength, 0.0)):
        if value is not None and not (isinstance(value, (int, float)) and lo <= value <= 1):  # NaN fails too
            raise ValueError(f"{name} must be a number in 0..1, got {value!r}")
    if r.operation == "edit" and strength == 0:
        raise ValueError("edit strength 0 keeps the picture as it is: choose a strength above 0")
    if (r.prompts or r.negative_prompts) and not takes_prompt(r.operation):
        raise ValueError("a prompt steers edit and inpaint; denoise removes the noise and keeps what your picture shows: "
                         "leave the prompt out, or pick edit or inpaint")
    add_noise = float(r.add_noise) if r.add_noise else None  # 0: none
    # the σ a denoise removes: the one given, else the noise added first (known), else None: estimated from the picture
    sigma = float(r.sigma) if r.sigma else add_noise
    return dataclasses.replace(r, steps=steps, strength=float(strength), sigma=sigma, add_noise=add_noise)


def _pil(x: torch.Tensor) -> Image.Image:
    """(1, 3, H, W) in [0, 1] -> PIL."""
    return uint8_to_pil(to_uint8(x[0]))

"""Your own images through a trained model: denoise, edit (SDEdit) and inpaint.

A diffusion model is a denoiser of its own kind of images. An image y = x + n with Gaussian noise of
standard deviation σ (pixel scale [0, 1], so 2σ in the model's [-1, 1]) is, scaled by √ᾱ_t, exactly
a noised x_t at the timestep where √((1 − ᾱ_t)/ᾱ_t) = 2σ:

    √ᾱ_t · y = √ᾱ_t · x + √(1 − ᾱ_t) · ε.

From there, `denoise` either takes the model's one-step x₀ prediction (method "mmse": the minimum
mean-squared-error estimate E[x | y], smooth where the image is uncertain) or runs the reverse chain
down to t = 0 (method "sample": a draw from p(x | y), sharper). `edit` noises an image to a chosen
strength and regenerates from there (SDEdit, Meng et al. 2022); `inpaint` regenerates masked pixels
while the known ones are put back, re-noised to each step's level (the replacement method behind
RePaint, Lugmayr et al. 2022, without its resampling jumps). All three are `sample()` started from the
user's image on DDPM's ancestral steps (the scheduler that takes custom timesteps), so classifier-free
guidance, class labels and a text model's prompts (`text`: "red apple" steers an edit or an inpainted hole toward
it) work as for sampling. Images are (B, 3, H, W) in [-1, 1]; results come back
in [0, 1] like `sample()`'s.

Every noise drawn here follows the seed rule (`denoiser.sampling.loop.image_generators`): image k's (an edit's
q(x_t | x₀), the chain's steps, inpainting's re-noised known pixels, `add_noise`'s) comes from its own
generator seeded seed + k, so image k of a batch is the single run of that image with seed + k.

`restore(unet, diffusion, image, operation, ...)` runs one of them on a user's picture at the model's size; the
front doors (the CLI's `denoiser denoise | edit | inpaint`, the app's Photo tab) reach it, and the tiles of a
one-step denoise at the photo's own size (denoiser.restore.tiles), through `denoiser.restore.plan`: one request, one plan, one run.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from diffusers import DDPMScheduler
from diffusers.utils.torch_utils import randn_tensor
from PIL import Image

from denoiser.diffusion import Diffusion
from denoiser.image_io import image_to_model, mask_to_model
from denoiser.pixels import to_unit
from denoiser.request import ADDED_NOISE_SEED, BUILT_IN, METHODS, OPERATIONS
from denoiser.sampling.guidance import Guidance, TextCondition
from denoiser.sampling.loop import SampleResult, image_generators, sample

__all__ = [
    "OPERATIONS", "Restoration", "restore", "estimate_sigma", "denoise", "edit", "inpaint", "psnr", "with_noise",
]

ClassLabel = int | Sequence[int] | torch.Tensor | None  # one for all or one per image: denoiser.sampling.loop.class_label_tensor
STEPS, STRENGTH = BUILT_IN["steps"], BUILT_IN["strength"]  # the defaults, written once (denoiser.request)


@dataclass
class Restoration:
    clean: torch.Tensor  # (1, 3, S, S) in [-1, 1]: the user's image at the model's size
    noisy: torch.Tensor | None  # the same with the added noise (the round trip), or None
    result: SampleResult  # images in [0, 1]
    sigma: float | None = None  # the noise σ denoise removed ([0, 1] pixel scale: the one given, or estimated)

    def psnr(self) -> tuple[float, float] | None:
        """(noisy, result) PSNR in dB against the clean input when noise was added, else None."""
        if self.noisy is None:
            return None
        target = to_unit(self.clean)
        return float(psnr(to_unit(self.noisy), target)), float(psnr(self.result.images, target))


def restore(
    unet, diffusion: Diffusion, image: Image.Image, operation: str, *, mask: Image.Image | None = None,
    sigma: float | None = None, method: str = "mmse", strength: float = STRENGTH, add_noise: float | None = None,
    steps: int = STEPS, seed: int = 0, class_label: ClassLabel = None, guidance: Guidance | None = None, callback=None,
    text: TextCondition | None = None,
) -> Restoration:
    """A user's picture through `operation` ("denoise", "edit" or "inpaint"), checked before any work.

    The image is resized and centre-cropped to the model's size (`denoiser.image_io.image_to_model`); a mask
    of another size is stretched onto it (white or opaque painted pixels are regenerated). `add_noise`
    adds Gaussian noise of that σ (pixel scale) first, seeded (the round trip, scored by `Restoration.psnr`).
    sigma: the noise σ `denoise` removes (None: estimated); method: "mmse" or "sample" (denoise only).
    class_label: as for sampling (`denoiser.sampling.loop.class_label_tensor`; the CLI and the app pass a plan's labels);
    text: a text model's encoded prompt (`Plan.text_condition`), None: unconditioned.
    A mask that marks nothing passes the image through, as a script asked (the app refuses it before any work:
    denoiser.restore.plan.resolve_restore's empty_mask_ok).
    """
    if operation not in OPERATIONS:
        raise ValueError(f"operation must be one of {', '.join(OPERATIONS)}, got {str(operation)[:40]!r}")
    if add_noise is not None and not add_noise > 0:
        raise ValueError(f"the noise to add first must be positive (σ on the [0, 1] pixel scale), got {add_noise}")
    if operation == "inpaint" and mask is None:
        raise ValueError("inpaint needs a mask: paint (or pass a mask image of) the area to regenerate")
    size = unet.config.sample_size
    clean = image_to_model(image, size)  # (1, 3, S, S) in [-1, 1]
    m = mask_to_model(mask, image.size, size) if operation == "inpaint" else None  # (1, 1, S, S)
    x = clean if add_noise is None else with_noise(clean, add_noise, seed)
    common = dict(steps=steps, seed=seed, class_label=class_label, guidance=guidance, callback=callback, text=text)
    if operation == "denoise":
        sigma = float(estimate_sigma(x).mean()) if sigma is None else float(sigma)  # as denoise() estimates it
        res = denoise(unet, diffusion, x, sigma=sigma, method=method, **common)
    elif operation == "edit":
        res = edit(unet, diffusion, x, strength=strength, **common)
    else:
        res = inpaint(unet, diffusion, x, m, **common)
    return Restoration(clean, None if add_noise is None else x, res, sigma if operation == "denoise" else None)


def estimate_sigma(images: torch.Tensor) -> torch.Tensor:
    """Noise std per image (pixel scale [0, 1]) of (B, C, H, W) images in [-1, 1], from the finest wavelet band.

    The diagonal Haar detail of each 2×2 block, (a − b − c + d)/2, holds mostly noise in natural images
    (edges rarely run diagonally through every block); for white Gaussian noise its standard deviation is
    the noise's own. A median absolute deviation / 0.6745 makes it robust to the edges that remain
    (Donoho & Johnstone 1994). Overestimates on images with much fine diagonal texture.
    """
    if images.ndim != 4 or images.shape[-1] < 2 or images.shape[-2] < 2:
        raise ValueError(f"images must be (B, C, H, W) with H, W >= 2, got {tuple(images.shape)}")
    x = images.double() / 2  # [-1, 1] -> unit pixel range
    H, W = x.shape[-2] // 2 * 2, x.shape[-1] // 2 * 2
    a, b = x[..., 0:H:2, 0:W:2], x[..., 0:H:2, 1:W:2]
    c, d = x[..., 1:H:2, 0:W:2], x[..., 1:H:2, 1:W:2]
    hh = (a - b - c + d) / 2  # (B, C, H/2, W/2)
    return (hh.flatten(1).abs().median(dim=1).values / 0.6745).float()  # (B,)


def with_noise(images: torch.Tensor, sigma: float, seed: int = 0) -> torch.Tensor:
    """images in [-1, 1] plus Gaussian noise of std `sigma` on the [0, 1] pixel scale (2σ here), seeded: image k's
    from a generator seeded seed + ADDED_NOISE_SEED + k (the seed rule)."""
    generators = image_generators(seed + ADDED_NOISE_SEED, range(images.shape[0]))
    noise = randn_tensor(images.shape, generator=generators, device=images.device, dtype=torch.float32)
    return images + 2 * sigma * noise


def _check(unet, images: torch.Tensor) -> None:
    config = unet.config
    want = (config.in_channels, config.sample_size, config.sample_size)
    if images.ndim != 4 or tuple(images.shape[1:]) != want:
        raise ValueError(f"images must be (B, {want[0]}, {want[1]}, {want[2]}) for this model, got {tuple(images.shape)}")


def _ancestral(diffusion: Diffusion) -> DDPMScheduler:
    """A fresh DDPM scheduler on the model's noise process: the one that takes custom timesteps."""
    return DDPMScheduler.from_config(diffusion.noise_schedule.config)


def _chain(t_start: int, steps: int) -> list[int]:
    """`steps` descending timesteps from t_start to 0 (fewer if t_start is small), each visited once."""
    n = max(1, min(steps, t_start + 1))
    return sorted({round(t_start * (1 - i / n)) for i in range(n)}, reverse=True)


def denoise(
    unet, diffusion: Diffusion, images: torch.Tensor, sigma: float | None = None, method: str = "mmse",
    steps: int = STEPS, seed: int = 0, class_label: ClassLabel = None, guidance: Guidance | None = None, callback=None,
    text: TextCondition | None = None,
) -> SampleResult:
    """Remove Gaussian noise of std `sigma` (pixel scale; None: estimated per batch, `estimate_sigma`)."""
    _check(unet, images)
    if method not in METHODS:
        raise ValueError(f"method must be 'mmse' (one x0 prediction) or 'sample' (the reverse chain), got {method!r}")
    if sigma is None:
        sigma = float(estimate_sigma(images).mean())
    t = diffusion.sigma_to_timestep(max(sigma, 1e-4))
    abar = float(diffusion.alphas_cumprod[t])
    timesteps = [t] if method == "mmse" else _chain(t, steps)
    # one DDPM step from t to "t = -1" (ᾱ = 1) adds no noise and returns the clipped x₀ prediction
    return sample(
        unet, _ancestral(diffusion), images.shape[0], seed=seed, timesteps=timesteps,
        x_init=abar**0.5 * images, class_labels=class_label, guidance=guidance,
        callback=callback, text=text,
    )


def edit(
    unet, diffusion: Diffusion, images: torch.Tensor, strength: float = STRENGTH, steps: int = STEPS, seed: int = 0,
    class_label: ClassLabel = None, guidance: Guidance | None = None, callback=None, text: TextCondition | None = None,
) -> SampleResult:
    """SDEdit: noise to t = strength·(T − 1) with seeded noise, then the reverse chain (strength 0: unchanged)."""
    _check(unet, images)
    if not 0.0 <= strength <= 1.0:
        raise ValueError(f"strength must be in [0, 1] (0 keeps the image, 1 samples anew), got {strength}")
    if strength == 0.0:
        return SampleResult(images=to_unit(images))
    t = round(strength * (diffusion.T - 1))
    # the seed rule: image k's noise, first q(x_t | x₀)'s then the chain's, from one generator seeded seed + k
    generators = image_generators(seed, range(images.shape[0]))
    noise = randn_tensor(images.shape, generator=generators, dtype=torch.float32)  # (B, C, H, W), on the CPU
    x_t = diffusion.add_noise(images.float().cpu(), noise, torch.tensor([t]))  # q(x_t | x₀)
    return sample(
        unet, _ancestral(diffusion), images.shape[0], generator=generators,
        timesteps=_chain(t, max(1, round(steps * strength))), x_init=x_t.to(images),
        class_labels=class_label, guidance=guidance, callback=callback, text=text,
    )


def inpaint(
    unet, diffusion: Diffusion, images: torch.Tensor, mask: torch.Tensor, steps: int = STEPS, seed: int = 0,
    class_label: ClassLabel = None, guidance: Guidance | None = None, callback=None, text: TextCondition | None = None,
) -> SampleResult:
    """Fill the pixels where `mask` is 1 (B or 1, 1, H, W); the others stay the input's, exactly at the end."""
    _check(unet, images)
    if mask.ndim != 4 or mask.shape[1] != 1 or mask.shape[-2:] != images.shape[-2:] or mask.shape[0] not in (1, images.shape[0]):
        raise ValueError(
            f"mask must be (1 or B, 1, H, W) matching the images' {tuple(images.shape[-2:])}, got {tuple(mask.shape)}"
        )
    hole = (mask > 0.5).to(images.dtype)
    timesteps = _chain(diffusion.T - 1, steps)
    # the seed rule: image k's start, each step's noise and its known pixels' re-noising, in turn from its generator
    generators = image_generators(seed, range(images.shape[0]))
    known = images.float()

    def put_back_known(i: int, x: torch.Tensor) -> torch.Tensor:
        if i + 1 == len(timesteps):  # x is the final x₀: the known pixels exactly
            return hole * x + (1 - hole) * known.to(x)
        # x is x_{t_next}: the known pixels noised to it
        noise = randn_tensor(known.shape, generator=generators, device=x.device, dtype=torch.float32).to(x)
        return hole * x + (1 - hole) * diffusion.add_noise(known.to(x), noise, torch.tensor([timesteps[i + 1]]))

    return sample(
        unet, _ancestral(diffusion), images.shape[0], generator=generators, timesteps=timesteps,
        class_labels=class_label, guidance=guidance, after_step=put_back_known, callback=callback, text=text,
    )


def psnr(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Peak signal-to-noise ratio in dB per image of two (B, C, H, W) batches in [0, 1]."""
    mse = (a.double() - b.double()).pow(2).flatten(1).mean(1)
    return (10 * torch.log10(1 / mse.clamp(min=1e-12))).float()

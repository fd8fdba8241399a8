"""Sampling: our own loop over a diffusers scheduler's `step`, with x₀ previews and attention capture.

The loop draws the starting noise and steps exactly as diffusers' `DDPMPipeline`/`DDIMPipeline` do,
so the same seed gives the same images. It adds what the pipelines lack: a per-step callback with
the predicted x₀ (for live previews and trajectories), class labels, batching, and capture of the
exact attention at chosen steps while the fused attention path stays on.

Two rules every sampling, editing and inpainting path shares live here, once: the seed rule
(`image_generators`: image k's noise from a CPU generator seeded seed + k) and the reading of class
labels (`class_label_tensor`: labels, numbers or names, one for all, one per image, or "spread").
"""

from __future__ import annotations

import contextlib
import inspect
import numbers
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field

import torch
from diffusers import (
    DDIMScheduler,
    DDPMScheduler,
    DPMSolverMultistepScheduler,
    EulerDiscreteScheduler,
    UniPCMultistepScheduler,
)
from diffusers.utils.torch_utils import randn_tensor

from denoiser.diffusion import Diffusion
from denoiser.fast import batch_invariant, mixed, precision, winograd
from denoiser.model.attention_capture import AttentionRecord, capture_attention
from denoiser.pixels import to_unit
from denoiser.request import BUILT_IN, SCHEDULERS, SPREAD, check_timestep_spacing
from denoiser.sampling.guidance import Guidance, TextCondition

__all__ = [
    "SAMPLERS", "Sampler", "make_sampler", "sample", "sampling_context", "SampleResult", "trajectory_strip",
    "image_generators", "class_label_tensor", "spread_labels",
]


@dataclass(frozen=True)
class Sampler:
    """A diffusers scheduler offered by name, and what it allows."""

    scheduler: type  # built with `from_config(the model's training scheduler config, **options)`
    options: tuple[tuple[str, str], ...] = ()
    integer_timesteps: bool = True  # steps on whole timesteps: one step's UNet call can be re-run exactly (the app)


# the samplers by name (denoiser.request.SCHEDULERS: the CLI's choices; the app offers those with integer timesteps)
SAMPLERS = {
    "ddim": Sampler(DDIMScheduler),
    "ddpm": Sampler(DDPMScheduler),
    "dpm++": Sampler(DPMSolverMultistepScheduler, (("algorithm_type", "dpmsolver++"),)),  # 2M: second order
    "unipc": Sampler(UniPCMultistepScheduler),  # UniPC (Zhao et al. 2023): bh2 predictor-corrector, order 2
    "euler": Sampler(EulerDiscreteScheduler, integer_timesteps=False),  # fractional timesteps
}
_ALIASES = {"dpmsolver++": "dpm++", "dpm-solver++": "dpm++", "dpmpp": "dpm++"}  # dpmpp: names joined by "+"


def make_sampler(name: str, train_scheduler_config, timestep_spacing: str | None = None):
    """A sampling scheduler built from the model's training scheduler config (same betas, prediction type).

    timestep_spacing: diffusers' choice of the sampled timesteps; "trailing" starts at t = T - 1, which
    few-step DDIM needs (Lin et al. 2024). None keeps each scheduler's default.
    """
    key = _ALIASES.get(name.lower(), name.lower())
    if key not in SAMPLERS:
        raise ValueError(f"unknown scheduler {name!r}; choose one of {', '.join(SCHEDULERS)}")
    extra = dict(SAMPLERS[key].options)
    if check_timestep_spacing(timestep_spacing) is not None:
        extra["timestep_spacing"] = timestep_spacing
    return SAMPLERS[key].scheduler.from_config(train_scheduler_config, **extra)


def image_generators(seed: int, indices: Iterable[int]) -> list[torch.Generator]:
    """The seed rule: image k of a request with seed S draws all its noise (its start, every step's, an edit's
    q(x_t | x₀), an inpainting's re-noised known pixels) from its own CPU generator seeded S + k, in that order,
    so neither the batch it lands in nor the other images change it (diffusers' one generator per image).

    indices: the images' k, e.g. range(n) for a whole request, [3, 4] for one shard of it.
    """
    return [torch.Generator(device="cpu").manual_seed(seed + int(k)) for k in indices]


def spread_labels(n: int, num_classes: int | None) -> torch.Tensor | None:
    """Class labels 0, 1, ..., K-1, 0, 1, ... for n images (None for unconditional models)."""
    return torch.arange(n) % num_classes if num_classes else None


def class_label_tensor(
    classes: int | str | Sequence[int | str] | torch.Tensor | None, num_images: int, num_classes: int | None,
    names: Sequence[str] = (),
) -> torch.Tensor | None:
    """Class labels as a (num_images,) long tensor, checked against the model: the one reader of them, for
    `sample`, denoiser.restore.chains and `denoiser.sampling.plan.resolve` (the CLI, the app and the pipeline).

    classes: None (no class: None back, the model's "no class" row), a label for all images or one per image
    (a whole number, its digits as a string, a name from `names`, a tensor), or "spread" (`spread_labels`).
    num_classes: the model's `num_class_embeds` (None or 0: unconditional). names: the classes' names by label
    (default: the labels' digits).
    """
    if classes is None:
        return None
    n = num_classes or 0
    if isinstance(classes, str) and classes == SPREAD:
        if not n:
            raise ValueError(f"classes {SPREAD!r} needs a class-conditional model; this one is unconditional: "
                             "leave the class out")
        return spread_labels(num_images, n)
    if not n:
        raise ValueError("this model is unconditional (it has no classes): leave the class label out")
    if isinstance(classes, torch.Tensor):
        given = classes.reshape(-1).tolist()
    elif isinstance(classes, (str, numbers.Number)):
        given = [classes]
    else:
        given = list(classes)
    if len(given) not in (1, num_images):
        raise ValueError(f"pass one class or one per image ({num_images}), got {len(given)}")
    names = tuple(names) or tuple(str(i) for i in range(n))
    values = [_class_value(c, names) for c in given]
    bad = [c for c in values if not (isinstance(c, numbers.Real) and float(c).is_integer() and 0 <= c < n)]
    if bad:
        shown = list(dict.fromkeys(bad))[:8]  # the distinct offenders, in order
        raise ValueError(f"class label out of range: each class must be a whole number in 0..{n - 1}, got {shown}")
    labels = [int(c) for c in values]
    return torch.tensor(labels * num_images if len(labels) == 1 else labels, dtype=torch.long)  # (num_images,)


def _class_value(c: object, names: tuple[str, ...]) -> object:
    """One class as given: a name's label, the number its digits spell, or the value itself (checked by the caller)."""
    if isinstance(c, torch.Tensor) and c.numel() == 1:
        return c.item()
    if not isinstance(c, str):
        return c
    if c.strip().lstrip("-").isdigit():
        return int(c)
    if c not in names:
        raise ValueError(f"unknown class {c!r}; this model's classes: {', '.join(names)}")
    return names.index(c)


@dataclass
class SampleResult:
    images: torch.Tensor  # (B, C, H, W) in [0, 1]
    trajectory: list[tuple[int, torch.Tensor, torch.Tensor]] = field(default_factory=list)  # (t, x_t, x0) in [0, 1]
    attention: dict[int, list[AttentionRecord]] = field(default_factory=dict)  # step index -> records


@torch.inference_mode()
def sample(
    unet: torch.nn.Module,
    scheduler,
    num_images: int = BUILT_IN["num_images"],
    num_inference_steps: int = BUILT_IN["steps"],
    seed: int = 0,
    eta: float = 0.0,
    class_labels: int | str | Sequence[int | str] | torch.Tensor | None = None,
    trajectory_every: int = 0,
    capture_steps: Iterable[int] = (),
    callback: Callable[[int, int, torch.Tensor, torch.Tensor], None] | None = None,
    guidance: Guidance | None = None,
    timesteps: Sequence[int] | None = None,
    x_init: torch.Tensor | None = None,
    after_step: Callable[[int, torch.Tensor], torch.Tensor] | None = None,
    generator: torch.Generator | list[torch.Generator] | None = None,
    text: TextCondition | None = None,
) -> SampleResult:
    """Generate `num_images` images; the same generators and settings as a diffusers pipeline -> the same images.

    callback(i, t, x_t, x0_pred) runs after every step (tensors in [-1, 1]); `trajectory_every=k`
    keeps x_t and x₀ every k steps; `capture_steps` lists step indices whose attention is recorded.
    guidance: classifier-free, perturbed-attention and autoguidance (denoiser.sampling.guidance); the main
    model's passes run as one batch per step (its captured attention: the images' own rows first; on a CPU, more than
    ROWS_PER_CALL rows as several calls of whole images, Guidance.main_pass).

    Starting elsewhere than pure noise (what denoising, editing and inpainting need, denoiser.restore.chains):
    `timesteps` is a descending list the chain visits instead of `num_inference_steps` evenly spaced
    ones (schedulers that take custom timesteps: DDPM, DPM-Solver++); `x_init` is x at `timesteps[0]`
    (in the model's input scale); `after_step(i, x)` may replace the x each step produces.

    class_labels: one for all images or one per image, read by `class_label_tensor` (None: no class).
    text: a text model's encoded prompts and negative prompts, one per image (denoiser.sampling.guidance.TextCondition).
    seed: image k's noise (its start and every step's) comes from a CPU generator seeded seed + k
    (`image_generators`), so neither the batch size nor the other images change it. generator: draws the noise
    instead (diffusers' pipelines take one for the batch or one per image; `image_generators(s, range(n))`
    gives the images of seed s).
    """
    _set_timesteps(scheduler, num_inference_steps, timesteps, num_images, eta)
    config = unet.config
    device, dtype = unet.device, unet.dtype
    labels = class_label_tensor(class_labels, num_images, config.num_class_embeds)
    labels = None if labels is None else labels.to(device)
    guidance = guidance or Guidance()
    if text is not None:
        if text.states.shape[0] != num_images:
            raise ValueError(f"give one prompt per image: {text.states.shape[0]} prompts for {num_images} images")
        text = text.to(device, dtype).at_timesteps(scheduler.timesteps)  # an edit counts its steps on these
    predict = guidance.predictor(unet, labels, text)
    if generator is None:
        generator = image_generators(seed, range(num_images))
    shape = (num_images, config.in_channels, config.sample_size, config.sample_size)
    # as diffusers' pipelines: the first latent scaled by init_noise_sigma, each model input through
    # scale_model_input (both identities for DDPM / DDIM / DPM-Solver, not for Euler-type schedulers)
    if x_init is not None:
        if tuple(x_init.shape) != shape:
            raise ValueError(f"x_init must have shape {shape}, got {tuple(x_init.shape)}")
        x = x_init.to(device=device, dtype=dtype)
    else:
        x = randn_tensor(shape, generator=generator, device=device, dtype=dtype) * scheduler.init_noise_sigma
    with sampling_context(unet), sampling_context(guidance.guide):
        return _denoise_steps(unet, scheduler, x, predict, generator, eta, trajectory_every, set(capture_steps),
                              callback, after_step)


def _set_timesteps(scheduler, num_inference_steps: int, timesteps: Sequence[int] | None, num_images: int,
                   eta: float) -> None:
    """Check the request (before any work) and set the scheduler's timesteps."""
    if timesteps is not None:
        timesteps = [int(t) for t in timesteps]
        if "timesteps" not in inspect.signature(scheduler.set_timesteps).parameters:
            raise ValueError(f"{type(scheduler).__name__} takes no custom timesteps; use DDPM or DPM-Solver++")
        if not timesteps or any(a <= b for a, b in zip(timesteps, timesteps[1:])) or timesteps[-1] < 0:
            raise ValueError(f"timesteps must be a non-empty strictly descending list of t >= 0, got {timesteps[:8]}")
        num_inference_steps = len(timesteps)
    if not 1 <= num_inference_steps <= scheduler.config.num_train_timesteps:
        raise ValueError(f"steps must be in 1..{scheduler.config.num_train_timesteps}, got {num_inference_steps}")
    if num_images < 1:
        raise ValueError(f"num_images must be at least 1, got {num_images}")
    if eta != 0.0 and not isinstance(scheduler, DDIMScheduler):
        raise ValueError(f"eta={eta} applies to DDIM only; {type(scheduler).__name__} has no eta: leave it at 0")
    if timesteps is not None:
        scheduler.set_timesteps(timesteps=timesteps)
    else:
        scheduler.set_timesteps(num_inference_steps)


def _denoise_steps(unet, scheduler, x, predict, generator, eta, trajectory_every, capture_steps, callback,
                   after_step) -> SampleResult:
    """The loop: one guided prediction and one scheduler step per timestep, with previews and capture."""
    diffusion = Diffusion(scheduler)  # the noise process's ε/v -> x₀, for the previews
    step_kwargs = {"eta": eta} if isinstance(scheduler, DDIMScheduler) else {}
    if "generator" in inspect.signature(scheduler.step).parameters:  # UniPC's step is deterministic and takes none
        step_kwargs["generator"] = generator
    result = SampleResult(images=x)
    for i, t in enumerate(scheduler.timesteps):
        x_in = scheduler.scale_model_input(x, t)  # the variance-preserving x_t the UNet was trained on
        if i in capture_steps:
            with capture_attention(unet) as records:
                out = predict(x_in, t)
            result.attention[i] = records
        else:
            out = predict(x_in, t)
        keep = trajectory_every and (i % trajectory_every == 0 or i == len(scheduler.timesteps) - 1)
        t_index = t.round().long().reshape(1)  # Euler-type schedulers step on fractional timesteps
        x0 = diffusion.predict_x0(x_in, out, t_index).clamp(-1, 1) if keep or callback else None
        if keep:
            result.trajectory.append((int(t), to_unit(x_in), to_unit(x0)))
        x = scheduler.step(out, t, x, **step_kwargs).prev_sample
        if after_step is not None:
            x = after_step(i, x)
        if callback is not None:
            callback(i, int(t), x_in, x0)
    result.images = to_unit(x)
    return result


@contextlib.contextmanager
def sampling_context(unet: torch.nn.Module | None) -> Iterator[None]:
    """What a loop of UNet calls with fixed weights sets up once: the precision they run in (`denoiser.fast.precision`:
    the running plan's, else chosen for `unet`: bf16 autocast where this machine measured it faster), and its 3x3 convolutions by
    Winograd's algorithm where they run in float32 on a CPU (`denoiser.fast.winograd`). Re-running a sampled step
    (the app's attention view) inside it repeats the sampling pass exactly."""
    if unet is None:
        yield
        return
    winograd.use_winograd(unet)
    batch_invariant.use_batch_invariant(unet)  # an image's rows the same in any batch
    mixed.use_mixed(unet)  # the mix's modules: float32 unless the precision is "mixed"
    with precision.autocast(unet):
        yield


def trajectory_strip(trajectory: list[tuple[int, torch.Tensor, torch.Tensor]], index: int = 0) -> torch.Tensor:
    """Rows x_t and predicted x₀ of image `index` over the kept steps -> (2·K, C, H, W) for a 2-row grid."""
    if not trajectory:
        raise ValueError("no trajectory was kept: pass trajectory_every > 0")
    xs = [x[index] for _, x, _ in trajectory]
    x0s = [x0[index] for _, _, x0 in trajectory]
    return torch.stack(xs + x0s)  # (2K, C, H, W)

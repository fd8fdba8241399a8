"""What a run asks for, typed: `SampleRequest` (sampling) and `RestoreRequest` (a user's picture denoised, edited or
inpainted), the forms every front door fills in.

The CLI (`denoiser sample | attention | attention-stats | evaluate --fid`), the app's engine and
`DenoiserPipeline.__call__` set the fields a user gave and leave the rest None; `denoiser.sampling.plan.resolve`
fills those from the model folder (its scheduler config, `sampling.json`, `classes.txt`) and from
`BUILT_IN` below, the only place the built-in defaults are written. The module imports nothing heavy, so
the command line can show its choices without loading torch. `denoiser.restore.plan.resolve_restore` does for a
`RestoreRequest` what `resolve` does for a `SampleRequest`.

Seed rule (diffusers' list-of-generators convention): image k of a request with seed S is drawn from its
own generator seeded S + k, its starting noise and every per-step noise (DDPM, DDIM with eta > 0) alike;
so the batch size, the front door and the other images never change an image. `denoiser.sampling.loop.image_generators`
is that rule, and every sampling, editing and inpainting path draws its noise through it. A prompt-to-prompt edit
(`edit`) is the one exception: every image starts from image 0's noise (seed S), since an edit is that picture.
The noise a restore adds first (the round trip) is image k's from a generator seeded S + ADDED_NOISE_SEED + k, so
it is never the noise that samples the same seed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

__all__ = ["PromptEdit", "EDIT_TYPES", "DEFAULT_CROSS_REPLACE", "DEFAULT_SELF_REPLACE", "GuidanceRequest", "SampleRequest", "RestoreRequest", "UNGUIDED", "SCHEDULERS", "SCHEDULER_CLASSES", "sampler_name", "TIMESTEP_SPACINGS", "BUILT_IN", "SPREAD", "OPERATIONS",
           "METHODS", "ADDED_NOISE_SEED", "check_timestep_spacing"]

# the samplers offered by name, each a diffusers scheduler class (denoiser.sampling.loop.SAMPLERS builds them), and
# diffusers' timestep spacings
SCHEDULER_CLASSES = {"ddim": "DDIMScheduler", "ddpm": "DDPMScheduler", "dpm++": "DPMSolverMultistepScheduler",
                     "unipc": "UniPCMultistepScheduler", "euler": "EulerDiscreteScheduler"}
SCHEDULERS = tuple(SCHEDULER_CLASSES)
TIMESTEP_SPACINGS = ("leading", "trailing", "linspace")
SPREAD = "spread"  # classes 0, 1, ..., K-1, 0, 1, ... over the images (FID's even spread)
OPERATIONS = ("denoise", "edit", "inpaint")  # what a restore does to a user's picture (denoiser.restore.chains)
METHODS = ("mmse", "sample")  # a denoise's: one x₀ prediction (the photo at its own size, in tiles) or the reverse chain
PRECISIONS = ("auto", "float32", "mixed", "bfloat16")  # what inference runs in (denoiser.fast.precision); auto: the machine's
ADDED_NOISE_SEED = 12_345  # the seed offset of the noise a restore adds first (see the seed rule above)

# what a request gets when neither it nor the model folder says otherwise
BUILT_IN = {
    # the model a door starts at (`denoiser sample` without --model, the app's first choice), found by name in
    # $DENOISER_WEIGHTS or a clone's weights/: the best shipped model that needs no prompt
    "model": "cifar10",
    "scheduler": "ddim",  # a folder's scheduler/ names its own (trailing timesteps for ours: cifar10 DDIM, emoji UniPC)
    "steps": 50,  # a folder's sampling.json may name its measured best as num_inference_steps
    "num_images": 8,  # images a run draws (the command line, the app, a request; diffusers' pipeline: its batch_size=1)
    # images per UNet batch: memory and speed only, never the images. On a GPU 64; on the CPU 16 (32 rows with
    # guidance): 64 images ran 1.19-1.25x faster than at 64 a batch, whose feature maps leave the caches
    # (bench/sample_batch.md)
    "batch_size": 64,
    "cpu_batch_size": 16,
    # an edit's (SDEdit's) noise level, in the range where Meng et al. (2022) trade keeping the picture against
    # redrawing it: with our models 0.1-0.3 keeps your picture and redraws its details, from ~0.5 the model draws
    # its own; an edit of your picture keeps it unless asked (not yet measured: docs/app.md)
    "strength": 0.3,
    # the images `denoiser attention-stats` generates to measure the heads: a fixed recipe, unguided
    "statistics_scheduler": "ddim",
    "statistics_steps": 25,
    # the noise levels t the heads are measured at (`denoiser attention-stats`, the app's Heads tab): from pure noise
    # (999) to nearly clean (30)
    "statistics_timesteps": (999, 800, 600, 400, 250, 100, 30),
}


EDIT_TYPES = ("replace", "refine", "reweight")
# chosen by the sweep in bench/prompt_to_prompt.md (8 colour swaps x 4 seeds on weights/emoji): the most shape kept
# (foreground IoU 0.902 against the plain target's 0.869) while the colour still moves >= 0.8 of the way the plain
# target's does (0.87). The self-attention fraction decides it; the cross-attention fraction changed no measure by
# more than 0.001 on that model (one token per word: a colour word's map is much like the one it replaces)
DEFAULT_CROSS_REPLACE = 0.4
DEFAULT_SELF_REPLACE = 0.4

_SPELLINGS = {"cross_replace_steps": "n_cross_replace", "self_replace_steps": "n_self_replace"}
_KEYS = {"edit_type", "equalizer_words", "equalizer_strengths", *_SPELLINGS, *_SPELLINGS.values()}


def _fraction(name: str, value) -> tuple[float, float]:
    """A step fraction f (-> [0, f]) or a pair [a, b], checked: 0 <= a <= b <= 1."""
    if isinstance(value, Mapping):
        raise ValueError(f"{name}: a fraction per word (a dict) is not supported here; give one fraction for every word, "
                         "e.g. 0.8, or a pair [start, end]")
    pair = (0.0, value) if isinstance(value, (int, float)) and not isinstance(value, bool) else value
    try:
        lo, hi = (float(v) for v in pair)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a fraction of the steps in 0..1 (e.g. 0.4) or a pair [start, end], got "
                         f"{value!r}") from None
    if not (math.isfinite(lo) and math.isfinite(hi) and 0.0 <= lo <= hi <= 1.0):
        raise ValueError(f"{name} must lie in 0..1 with start <= end, got {value!r}")
    return lo, hi


@dataclass(frozen=True)
class PromptEdit:
    """What a prompt-to-prompt call asks for: diffusers' community pipeline's `cross_attention_kwargs`, typed."""

    edit_type: str = "replace"  # one of EDIT_TYPES
    cross_replace_steps: tuple[float, float] = (0.0, DEFAULT_CROSS_REPLACE)  # steps whose word maps come from the source
    self_replace_steps: tuple[float, float] = (0.0, DEFAULT_SELF_REPLACE)  # steps whose pixel maps come from the source
    equalizer_words: tuple[str, ...] = ()  # "reweight": the words whose maps are scaled
    equalizer_strengths: tuple[float, ...] = ()  # "reweight": one factor for all those words, or one per word

    def __post_init__(self) -> None:
        if self.edit_type not in EDIT_TYPES:
            raise ValueError(f"edit_type must be one of {', '.join(EDIT_TYPES)}, got {self.edit_type!r}")
        object.__setattr__(self, "cross_replace_steps", _fraction("cross_replace_steps", self.cross_replace_steps))
        object.__setattr__(self, "self_replace_steps", _fraction("self_replace_steps", self.self_replace_steps))
        words = (self.equalizer_words,) if isinstance(self.equalizer_words, str) else tuple(self.equalizer_words)
        strengths = self.equalizer_strengths
        strengths = (strengths,) if isinstance(strengths, (int, float)) else tuple(strengths)
        object.__setattr__(self, "equalizer_words", words)
        object.__setattr__(self, "equalizer_strengths", tuple(float(s) for s in strengths))
        if self.edit_type == "reweight":
            if not words or not strengths:
                raise ValueError('edit_type "reweight" needs equalizer_words and equalizer_strengths, e.g. '
                                 '{"equalizer_words": ["red"], "equalizer_strengths": [2.0]}')
            if len(strengths) not in (1, len(words)):
                raise ValueError(f"give one equalizer strength, or one per word: {len(words)} words, {len(strengths)} "
                                 "strengths")
            if any(not (math.isfinite(s) and 0.0 <= s <= 10.0) for s in self.equalizer_strengths):
                raise ValueError(f"equalizer_strengths must lie in 0..10, got {list(self.equalizer_strengths)}")
        elif words or strengths:
            raise ValueError(f'equalizer_words and equalizer_strengths belong to edit_type "reweight", not '
                             f'{self.edit_type!r}')

    def describe(self) -> str:
        """E.g. "prompt-to-prompt replace: word maps from the source for steps 0-0.4, layout 0-0.4"."""
        (c0, c1), (s0, s1) = self.cross_replace_steps, self.self_replace_steps
        what = f"prompt-to-prompt {self.edit_type}: word maps from the source for steps {c0:g}-{c1:g}, layout {s0:g}-{s1:g}"
        if self.edit_type == "reweight":
            what += f", {', '.join(self.equalizer_words)} x{'/'.join(f'{s:g}' for s in self.equalizer_strengths)}"
        return what

    @classmethod
    def from_kwargs(cls, kwargs: Mapping) -> PromptEdit:
        """From the community pipeline's `cross_attention_kwargs`; either spelling of the fractions, unknown keys refused."""
        if not isinstance(kwargs, Mapping):
            raise TypeError(f"cross_attention_kwargs must be a dict, got {type(kwargs).__name__}")
        if "local_blend_words" in kwargs:
            raise ValueError("cross_attention_kwargs: local_blend_words (LocalBlend) is not supported: leave it out; the "
                             "self-attention injection (self_replace_steps) keeps the picture outside the edited words")
        unknown = sorted(set(kwargs) - _KEYS)
        if unknown:
            raise ValueError(f"cross_attention_kwargs: unknown key(s) {', '.join(map(repr, unknown))}; known: "
                             f"{', '.join(sorted(_KEYS))}")
        if "edit_type" not in kwargs:
            raise ValueError(f'cross_attention_kwargs needs "edit_type": one of {", ".join(EDIT_TYPES)}')
        args = {"edit_type": kwargs["edit_type"]}
        for readme, code in _SPELLINGS.items():
            if readme in kwargs and code in kwargs and kwargs[readme] != kwargs[code]:
                raise ValueError(f"cross_attention_kwargs gives both {readme}={kwargs[readme]!r} and {code}="
                                 f"{kwargs[code]!r}: they are one setting, give one")
            if readme in kwargs or code in kwargs:
                args[readme] = kwargs.get(readme, kwargs.get(code))
        for key in ("equalizer_words", "equalizer_strengths"):
            if key in kwargs:
                args[key] = kwargs[key]
        return cls(**args)


@dataclass(frozen=True)
class GuidanceRequest:
    """How a run is steered, for sampling and restoring alike. None: the model folder's sampling.json (its
    classifier-free scale only with a class or prompt), else off. The names are sampling.json's keys."""

    guidance_scale: float | None = None  # classifier-free guidance w (1 = off)
    pag_scale: float | None = None  # perturbed-attention guidance s (0 = off)
    pag_layers: str | Sequence[str] | None = None  # comma-separated or a list of attention layer names
    guide_model: str | None = None  # autoguidance's guide folder (sampling.json's is relative to the model folder)
    guide_scale: float | None = None  # autoguidance weight a (1 = off)
    guidance_interval: Sequence[float] | None = None  # [lo, hi] timesteps the guidance applies at


UNGUIDED = GuidanceRequest(guidance_scale=1.0, pag_scale=0.0, guide_scale=1.0)  # every term off, whatever the folder says


@dataclass
class SampleRequest:
    """One sampling run. None: the model folder's default, else `BUILT_IN`, else off."""

    num_images: int = BUILT_IN["num_images"]
    classes: int | str | Sequence[int | str] | None = None  # a label or name for all, one per image, "spread"; None: no class
    prompts: str | Sequence[str] | None = None  # a text model's prompt for all images or one per image; None or "": no condition
    negative_prompts: str | Sequence[str] | None = None  # what guidance steers away from (one, or one per image); None: ""
    seed: int = 0  # image k is drawn from a generator seeded seed + k
    batch_size: int | None = None  # images per UNet batch (BUILT_IN)
    scheduler: str | None = None  # one of SCHEDULERS; None: the folder's scheduler, else BUILT_IN
    steps: int | None = None  # None: sampling.json's num_inference_steps, else BUILT_IN
    timestep_spacing: str | None = None  # one of TIMESTEP_SPACINGS; None: the folder's scheduler config
    eta: float = 0.0  # DDIM's stochasticity (0: deterministic); DDIM only
    guidance: GuidanceRequest = field(default_factory=GuidanceRequest)
    edit: PromptEdit | None = None  # prompt-to-prompt: image 0's prompt the source, images 1.. its edits (one batch)
    precision: str | None = None  # "float32" or "bfloat16"; None or "auto": this machine's (denoiser.fast.precision)


def sampler_name(scheduler_class: str) -> str:
    """A scheduler class's name (e.g. "DDIMScheduler") as the sampler name it is offered under; other classes
    (a scheduler a pipeline user swapped in) keep their own name."""
    return next((name for name, cls in SCHEDULER_CLASSES.items() if cls == scheduler_class), scheduler_class)


def check_timestep_spacing(value: str | None) -> str | None:
    """`value`, checked to be one of TIMESTEP_SPACINGS; None (the scheduler config's own) passes through.
    The one check of a spacing, for the CLI, the app and the pipeline alike."""
    if value is not None and value not in TIMESTEP_SPACINGS:
        raise ValueError(f"timestep spacing must be one of {', '.join(TIMESTEP_SPACINGS)}, got {value!r}")
    return value


@dataclass
class RestoreRequest:
    """One restore of a user's picture. None: `BUILT_IN`; the class, prompts and guidance as for sampling (the model
    folder's sampling.json fills the guidance a class or prompt gets)."""

    operation: str  # one of OPERATIONS
    method: str = "mmse"  # denoise: one of METHODS ("mmse": one x₀ prediction, at the photo's size; "sample": the chain)
    sigma: float | None = None  # denoise: the noise σ to remove ([0, 1] pixel scale); None or 0: add_noise, else estimated
    strength: float | None = None  # edit: how far the picture is noised before it is redrawn, in (0, 1]; None: BUILT_IN
    add_noise: float | None = None  # σ of Gaussian noise added first (the round trip, scored by PSNR); None or 0: none
    steps: int | None = None  # the reverse chain's steps (an edit takes strength·steps of them); None: BUILT_IN
    seed: int = 0  # the chain's noise and the added noise, by the seed rule
    classes: int | str | None = None  # a class label or name (a class model); None: no class
    prompts: str | None = None  # a text model's prompt for edit and inpaint (a denoise keeps what the picture shows)
    negative_prompts: str | None = None  # what guidance steers away from; None: ""
    guidance: GuidanceRequest = field(default_factory=GuidanceRequest)
    precision: str | None = None  # "float32" or "bfloat16"; None or "auto": this machine's (denoiser.fast.precision)

    @property
    def tiled(self) -> bool:
        """The one rule of where a restore works: a one-step denoise keeps the photo's size (overlapping tiles at the
        model's size, noise added first or not); every chain works on the centre square at the model's size."""
        return self.operation == "denoise" and self.method == "mmse"

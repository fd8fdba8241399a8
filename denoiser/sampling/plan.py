"""One way to sample: a `SampleRequest` resolved against a model folder into a `Plan`, and `run(plan)`.

    plan = resolve(SampleRequest(num_images=8, classes="cat", seed=0), "weights/cifar10")
    images = run(plan).images  # (8, 3, 32, 32) in [0, 1]

`resolve` takes the model loaded once (`denoiser.folders.model_dir.LoadedModel`: its UNet, noise schedule, text model and
what its folder says about sampling it) or a folder to load, and is the only loader of autoguidance's guide model;
the request's fields win over the folder's, the folder's over `denoiser.request.BUILT_IN`. `run` owns batching and the
per-step callbacks, and gives each batch its images' generators by the seed rule (image k from a generator
seeded seed + k, `denoiser.sampling.loop.image_generators`); the loop itself is `denoiser.sampling.loop.sample`, the
reading of class labels `denoiser.sampling.loop.class_label_tensor`, the guidance maths `denoiser.sampling.guidance`. The
CLI, `evaluate --fid`, the app's engine and `DenoiserPipeline.__call__` only fill the request.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn
from tqdm.auto import tqdm

from denoiser.fast.precision import Precision, choose_precision, running
from denoiser.folders.model_dir import (
    SAMPLING_FILE,
    LoadedModel,
    ModelDefaults,
    TextModel,
    load,
    require_text,
)
from denoiser.request import BUILT_IN, PromptEdit, SampleRequest, check_timestep_spacing, sampler_name
from denoiser.sampling.guidance import Guidance, TextCondition, check_guide
from denoiser.sampling.loop import (
    SampleResult,
    class_label_tensor,
    image_generators,
    make_sampler,
    sample,
)
from denoiser.sampling.prompt_notes import read_as_note, unread_note, unseen_note
from denoiser.sampling.prompt_to_prompt import edit_plan
from denoiser.sampling.prompt_weights import WeightedPrompt, parse_prompt

__all__ = ["Plan", "resolve", "run"]

logger = logging.getLogger(__name__)


@dataclass
class Plan:
    """A request resolved for one model: everything `run` needs, nothing left to look up."""

    unet: nn.Module
    scheduler: object  # a diffusers scheduler built from the model's noise schedule; `sample` sets its timesteps
    steps: int
    eta: float
    guidance: Guidance
    labels: torch.Tensor | None  # (num_images,) class labels, or None: the model's "no class" row
    seed: int
    num_images: int
    batch_size: int
    classes: tuple[str, ...] = ()  # the model's class names by label
    prompts: tuple[str, ...] = ()  # a text model's prompt per image ("" = no condition); () for a class model
    negative_prompts: tuple[str, ...] = ()  # per image, the classifier-free guidance's unconditional prompt
    text: TextModel | None = None  # a text model's tokenizer and encoder
    edit: PromptEdit | None = None  # prompt-to-prompt over the images (image 0 the source): one batch, image 0's noise
    precision: Precision = Precision(torch.float32, "float32")  # what the UNet runs in: chosen once by resolve, held by run
    # each distinct prompt and negative prompt, read once by resolve ("(red:1.5) apple": its words and their weights);
    # the encoding, the word lists and the notes all read these
    parsed: dict[str, WeightedPrompt] = dataclasses.field(default_factory=dict, repr=False, compare=False)
    _encoded: dict = dataclasses.field(default_factory=dict, repr=False, compare=False)  # text_condition's, by images

    @property
    def scheduler_name(self) -> str:
        return sampler_name(type(self.scheduler).__name__)

    def timesteps(self) -> list[int]:
        """The timesteps the sampler will visit (what the app's work budget counts)."""
        self.scheduler.set_timesteps(self.steps)
        return [int(t) for t in self.scheduler.timesteps]

    def text_condition(self, indices: Sequence[int]) -> TextCondition | None:
        """The encoded prompts of images `indices` (None for a class model), encoded once per set of images."""
        if self.text is None:
            return None
        key = tuple(int(k) for k in indices)
        if key not in self._encoded:
            cond = TextCondition.encode(self.text.tokenizer, self.text.encoder, [self.parsed[self.prompts[k]] for k in key],
                                        [self.parsed[self.negative_prompts[k]] for k in key], edit=self.edit)
            # an edit counts its steps on the plan's timesteps: a re-run step counts as sampled
            self._encoded[key] = cond if self.edit is None else cond.at_timesteps(self.timesteps())
        return self._encoded[key]

    def words(self, k: int = 0) -> tuple[str, ...]:
        """Image k's prompt as the model reads it: its words (weights taken out, cut at the tokenizer's length)."""
        if self.text is None or not self.prompts:
            return ()
        return tuple(self.text.tokenizer.tokens(self.parsed[self.prompts[k]].text))

    def unseen(self, k: int = 0) -> tuple[str, ...]:
        """Image k's words that no training caption held (the model folder's vocabulary): drawn from their n-grams
        alone, so the model is guessing; () without a vocabulary or a prompt."""
        if self.text is None or not self.prompts:
            return ()
        return tuple(self.text.tokenizer.unseen(self.parsed[self.prompts[k]].text))

    def unread(self, k: int = 0) -> tuple[str, ...]:
        """Image k's words past the tokenizer's max_length: cut, the model never reads them; () for none."""
        if self.text is None or not self.prompts:
            return ()
        return tuple(self.text.tokenizer.dropped(self.parsed[self.prompts[k]].text))

    def image_notes(self, k: int = 0) -> list[str]:
        """What a person should hear about image k's prompt (denoiser.sampling.prompt_notes): read with marks
        dropped, cut at the tokenizer's length, words never seen in training; [] for none or no text model."""
        if self.text is None or not self.prompts:
            return []
        return [n for n in (read_as_note(self.parsed[self.prompts[k]]), unread_note(self.words(k), self.unread(k)),
                            unseen_note(self.unseen(k))) if n]

    def log_notes(self) -> list[str]:
        """`image_notes` of every distinct prompt and negative prompt, each naming its prompt: `run` logs each once."""
        if self.text is None:
            return []
        said = []
        for name, prompts in (("prompt", self.prompts), ("negative prompt", self.negative_prompts)):
            for p in dict.fromkeys(prompts):
                text = self.parsed[p].text
                read, unread = self.text.tokenizer.tokens(text), self.text.tokenizer.dropped(text)
                notes = (read_as_note(self.parsed[p]), unread_note(read, unread), unseen_note(self.text.tokenizer.unseen(text)))
                said += [f"the {name} “{p[:80]}”: {n}" for n in notes if n]
        return said

    def word_weights(self, k: int = 0) -> tuple[float, ...]:
        """Image k's weight per word of `words(k)` ("(red:1.5)": 1.5; 1 for a plain word)."""
        return self.parsed[self.prompts[k]].weights[: self.text.tokenizer.config.max_length] if self.prompts else ()

    def class_name(self, k: int) -> str | None:
        """Image k's class name, or None when it has no class."""
        if self.labels is None:
            return None
        label = int(self.labels[k])
        return self.classes[label] if label < len(self.classes) else str(label)

    def describe(self) -> str:
        spacing = self.scheduler.config.get("timestep_spacing", "leading")
        what = f"{self.scheduler_name}-{self.steps}, {self.guidance.describe()}, {spacing} timesteps, seed {self.seed}"
        what = what if self.edit is None else f"{what}, {self.edit.describe()}"
        return f"{what}, {self.precision.describe()}"


def resolve(
    request: SampleRequest,
    model: LoadedModel | str | Path,
    *,
    load: Callable[[Path], LoadedModel] = load,
    samplers: Sequence[str] | None = None,
) -> Plan:
    """`request` for `model`, checked before any work; unset fields from the model's folder, else built in. The one
    place a folder's defaults are applied: a door that shows them (the app's form) shows what this returns.

    model: the model loaded once (`denoiser.folders.model_dir.load`, `LoadedModel.of` for one in memory or a
    pipeline's components), or its folder (then `load(folder)`).
    load(folder) -> LoadedModel: how a folder and autoguidance's guide are loaded (the app's is cached).
    samplers: the samplers this door runs (the app's: those whose steps it can re-run); a request naming another is
    refused, and a folder naming another samples with BUILT_IN's. None: every one.
    """
    if isinstance(model, (str, Path)):
        model = load(Path(model))
    if not isinstance(model, LoadedModel):
        raise TypeError(f"resolve needs a loaded model (denoiser.folders.model_dir.load) or its folder, got "
                        f"{type(model).__name__}")
    folder, unet, text, defaults = model.folder, model.unet, model.text, model.defaults
    given = model.sampler is not None
    scheduler = model.sampler if given else model.noise_schedule
    sched = _scheduler(request, defaults.scheduler, scheduler, given, samplers)
    labels = class_label_tensor(request.classes, request.num_images, unet.config.num_class_embeds, defaults.classes)
    prompts, negative, text, parsed = _prompts(request, unet, folder, text)
    guidance = _guidance(request, defaults, folder, unet, sched.config, labels is not None or any(prompts), load)
    steps = request.steps if request.steps is not None else defaults.steps
    batch_size = request.batch_size
    if batch_size is None:  # the CPU's own: its caches (BUILT_IN)
        batch_size = BUILT_IN["cpu_batch_size" if unet.device.type == "cpu" else "batch_size"]
    if request.edit is not None:
        _check_edit(request, [parsed[p] for p in prompts], text, guidance)
        batch_size = request.num_images  # the source and its edits attend together: one batch
    for name, value in (("number of images", request.num_images), ("batch size", batch_size)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a whole number >= 1, got {value!r}")
    if not isinstance(steps, int) or not 1 <= steps <= sched.config.num_train_timesteps:
        raise ValueError(f"steps must be a whole number in 1..{sched.config.num_train_timesteps}, got {steps!r}")
    plan = Plan(unet, sched, steps, float(request.eta), guidance, labels, int(request.seed), request.num_images,
                batch_size, defaults.classes, prompts, negative, text, request.edit, choose_precision(unet, request.precision),
                parsed)
    # what each guidance term needs (a class or a prompt for classifier-free guidance, PAG's layers), before any work:
    # the loop checks each batch the same way, a step too late for a page that said the job had started
    guidance.check(unet, labels is not None, text is not None)  # no prompt encoded: the budget note resolves per keystroke
    return plan


def _check_edit(request: SampleRequest, prompts: Sequence[WeightedPrompt], text: TextModel | None,
                guidance: Guidance) -> None:
    """A prompt-to-prompt request, before any work: a text model, the source and its edits, no PAG, maps that fit."""
    if not isinstance(request.edit, PromptEdit):
        raise TypeError(f"edit must be a denoiser.request.PromptEdit, got {type(request.edit).__name__}")
    if text is None:
        raise ValueError("prompt-to-prompt edits a text model's prompt; this model takes no text")
    if guidance.pag:
        raise ValueError("prompt-to-prompt takes the source's self-attention maps, which perturbed-attention guidance "
                         "replaces: set the PAG scale to 0 for an edit")
    edit_plan(request.edit, [text.tokenizer.tokens(p.text) for p in prompts])  # the word maps, checked now


def _prompts(request: SampleRequest, unet: nn.Module, folder,
             text: TextModel | None) -> tuple[tuple, tuple, TextModel | None, dict[str, WeightedPrompt]]:
    """(prompt per image, negative prompt per image, its TextModel, each distinct prompt parsed) for a text model;
    ((), (), None, {}) otherwise. Words past the tokenizer's max_length are dropped (Plan.log_notes says which)."""
    n = request.num_images
    if getattr(unet.config, "cross_attention_dim", None) is None:
        if request.prompts not in (None, "") or request.negative_prompts not in (None, ""):
            raise ValueError("this model takes no prompt (it was trained without text): leave the prompt out"
                             + (" and pick a class" if unet.config.num_class_embeds else ""))
        return (), (), None, {}
    if text is None:
        text = require_text(folder, unet.device)
    per_image, parsed = [], {}
    for name, value in (("prompt", request.prompts), ("negative prompt", request.negative_prompts)):
        given = [""] if value is None else [value] if isinstance(value, str) else list(value)
        if len(given) not in (1, n) or not all(isinstance(p, str) for p in given):
            raise ValueError(f"pass one {name} or one per image ({n}), as text; got {len(given)} of "
                             f"{sorted({type(p).__name__ for p in given})}")
        for p in given:  # read once, here: a malformed weight is an error before any work
            if p not in parsed:
                parsed[p] = parse_prompt(p)
        per_image.append(tuple(given * n if len(given) == 1 else given))
    return per_image[0], per_image[1], text, parsed


def run(
    plan: Plan,
    *,
    indices: Sequence[int] | None = None,
    generator: torch.Generator | list[torch.Generator] | None = None,
    callback: Callable[[int, int, torch.Tensor, torch.Tensor], None] | None = None,
    after_step: Callable[[int, torch.Tensor], torch.Tensor] | None = None,
    capture_steps: Sequence[int] = (),
    trajectory_every: int = 0,
    progress: bool = False,
) -> SampleResult:
    """Sample the plan's images (or only `indices` of them, e.g. one shard of an FID run) in batches.

    Image k comes from a CPU generator seeded plan.seed + k (`image_generators`), whatever the batch it lands
    in. generator: the caller's instead (diffusers' convention: one per image, or one for the whole request in
    a single batch).
    callback(i, t, x_t, x0) and after_step(i, x) run at every step of every batch (denoiser.sampling.loop.sample);
    the attention of `capture_steps` and the trajectory are kept for the first batch. progress: a tqdm bar.
    """
    for notice in plan.log_notes():  # once per run: resolving (the app's note, on every keystroke) says nothing
        logger.warning(notice)
    indices = list(range(plan.num_images)) if indices is None else [int(k) for k in indices]
    if any(not 0 <= k < plan.num_images for k in indices):
        raise ValueError(f"image indices must be in 0..{plan.num_images - 1}")
    if isinstance(generator, list) and len(generator) != plan.num_images:
        raise ValueError(f"pass one generator per image ({plan.num_images}), got {len(generator)}")
    if plan.edit is not None:
        if indices != list(range(plan.num_images)):
            raise ValueError("a prompt-to-prompt edit samples its source and edits together: leave indices out")
        if generator is not None:  # the caller's: image 0's (the first one's) state for every image
            first = generator[0] if isinstance(generator, list) else generator
            generator = [_copy_generator(first) for _ in range(plan.num_images)]
    batch_size = len(indices) if isinstance(generator, torch.Generator) else plan.batch_size
    with running(plan.precision):  # chosen once, in resolve: every batch, and the guide model, run in it
        return _run_batches(plan, indices, batch_size, generator, callback, after_step, capture_steps, trajectory_every,
                            progress)


def _run_batches(plan: Plan, indices: list[int], batch_size: int, generator, callback, after_step, capture_steps,
                 trajectory_every: int, progress: bool) -> SampleResult:
    """`run`'s batches, in the plan's precision."""
    result = SampleResult(images=torch.empty(0))
    chunks = []
    bar = tqdm(total=len(indices), desc="sampling", unit="img", disable=not progress, dynamic_ncols=True)
    for start in range(0, len(indices), batch_size):
        batch = indices[start : start + batch_size]
        if generator is None:  # an edit: every image from image 0's noise (the request's seed rule)
            gens = image_generators(plan.seed, [0] * len(batch) if plan.edit is not None else batch)
        elif isinstance(generator, torch.Generator):
            gens = generator
        else:  # the caller's, one per image
            gens = [generator[k] for k in batch]
        first = start == 0
        res = sample(
            plan.unet, plan.scheduler, len(batch), plan.steps, eta=plan.eta, generator=gens, guidance=plan.guidance,
            class_labels=None if plan.labels is None else plan.labels[batch], callback=callback, after_step=after_step,
            text=plan.text_condition(batch),
            capture_steps=capture_steps if first else (), trajectory_every=trajectory_every if first else 0,
        )
        if first:
            result = res
        chunks.append(res.images)
        bar.update(len(batch))
    bar.close()
    result.images = torch.cat(chunks)  # (len(indices), C, H, W) in [0, 1]
    return result


def _copy_generator(g: torch.Generator) -> torch.Generator:
    """A new generator in `g`'s state: it draws what `g` would draw next."""
    copy = torch.Generator(device=g.device)
    copy.set_state(g.get_state())
    return copy


def _scheduler(request: SampleRequest, default: str, base, given: bool, samplers: Sequence[str] | None):
    """The sampler: the request's by name, else the scheduler given as it is (the pipeline's, which its user may
    have swapped), else the folder's (BUILT_IN's where `samplers` lacks it); on `base`'s noise schedule, with the
    request's timestep spacing."""
    spacing = check_timestep_spacing(request.timestep_spacing)
    if samplers is not None:
        if request.scheduler is not None and request.scheduler not in samplers:
            raise ValueError(f"scheduler must be one of {', '.join(samplers)}, got {request.scheduler!r}")
        default = default if default in samplers else BUILT_IN["scheduler"]
    if request.scheduler is None and given:
        if spacing is None:
            return base
        return type(base).from_config(base.config, timestep_spacing=spacing)
    return make_sampler(request.scheduler or default, base.config, spacing)


def _guidance(request, defaults: ModelDefaults, folder, unet, scheduler_config, has_class: bool, load) -> Guidance:
    """The request's guidance terms, the rest from sampling.json (its classifier-free scale only with a class),
    else off; the guide model loaded only when autoguidance is on."""
    folder_values = dict(defaults.guidance or {})
    if not has_class:
        folder_values.pop("guidance_scale", None)

    def pick(key: str, off):
        value = getattr(request.guidance, key)
        return value if value is not None else folder_values.get(key, off)

    guide_scale = float(pick("guide_scale", 1.0))
    guide = None
    if guide_scale != 1.0:
        guide = _load_guide(request.guidance.guide_model, folder_values.get("guide_model"), folder, unet, scheduler_config, load)
    return Guidance(
        scale=float(pick("guidance_scale", 1.0)), pag_scale=float(pick("pag_scale", 0.0)),
        pag_layers=pick("pag_layers", None), guide=guide, guide_scale=guide_scale,
        interval=pick("guidance_interval", None),
    )


def _load_guide(asked, from_folder, folder, unet, scheduler_config, load) -> nn.Module:
    """Autoguidance's guide: the request's folder, else the one sampling.json names (which must stay inside the
    model folder); checked to model the same data."""
    if asked is not None:
        path = Path(asked)
    elif from_folder is not None and folder is not None:
        path = (Path(folder) / from_folder).resolve()
        if not path.is_relative_to(Path(folder).resolve()):
            raise ValueError(f"{SAMPLING_FILE}'s guide_model must be a folder inside the model folder, got {from_folder!r}")
    else:
        raise ValueError("autoguidance (guide scale != 1) needs a guide model, and this model ships no guide model (its "
                         "sampling.json names none): pass one (--guide-model FOLDER) or set the guide scale to 1")
    guide = load(path)
    check_guide(unet, scheduler_config, guide.unet, guide.noise_schedule.config)
    return guide.unet

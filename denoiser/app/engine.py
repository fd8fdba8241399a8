"""The web app's engine, without the web: models by name, generation with previews, your images restored,
then any pixel's attention, the heads' statistics and layers switched off. Returns tensors, images and
plain data; the words and Markdown a page shows are the tab modules' (denoiser/app/*_tab.py).
The attention views and the Generation they read are in denoiser/app/attention_views.py (`Engine.views`).

Sampling runs the fused attention path and keeps only the model inputs x_t of every step (a few MB).
Opening the attention view for a step re-runs that step's UNet call on the same batch under
`capture_attention`: the same inputs and shapes give bit-identical q and k, so the weights shown are
the exact weights of the sampling pass, rebuilt for the clicked pixel only (O(N·d) memory per layer).
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from PIL import Image
from torchvision.transforms.functional import pil_to_tensor

from denoiser.app.attention_views import AttentionViews, Generation, Stages
from denoiser.app.form_limits import LIMITS, MAX_PROMPT_CHARS, check_int, check_scales
from denoiser.app.photo_time import PhotoTime, measure_tile_rate, photo_seconds
from denoiser.app.work_budget import plan_work, work_of
from denoiser.folders.model_dir import LoadedModel, ModelDefaults, find_model, list_models, load, model_roots
from denoiser.image_io import MAX_PIXELS
from denoiser.pixels import to_unit, uint8_to_unit
from denoiser.request import GuidanceRequest, RestoreRequest, SampleRequest
from denoiser.restore.plan import RestoreResult, check_request, resolve_restore, run_restore
from denoiser.restore.tiles import count_tiles
from denoiser.sampling.guidance import Guidance
from denoiser.sampling.loop import SAMPLERS
from denoiser.sampling.plan import Plan, resolve, run
from denoiser.sampling.prompt_weights import parse_prompt

__all__ = ["Engine", "Generation", "Stages", "APP_SCHEDULERS", "RESTORE_OPERATIONS", "check_prompt"]

# what the Photo tab does to a user's image (denoiser.restore.plan) -> (operation, method); "denoise" is the one-step
# MMSE estimate (the photo at its own size, in tiles), "denoise (sampled)" the reverse chain
RESTORE_OPERATIONS = {"denoise": ("denoise", "mmse"), "denoise (sampled)": ("denoise", "sample"),
                      "edit": ("edit", "mmse"), "inpaint": ("inpaint", "mmse")}

# the app's samplers: of denoiser.request.SCHEDULERS, those with integer timesteps (the attention view re-runs a
# step's exact UNet call; euler's fractional timesteps cannot be)
APP_SCHEDULERS = tuple(name for name, s in SAMPLERS.items() if s.integer_timesteps)

PREVIEW_SIDE = 256  # a tiled denoise's live preview: at most this many pixels a side


class Engine:
    """Models under folders of model folders, loaded once; generation and attention views."""

    def __init__(self, weights_dir: str | Path | Sequence[str | Path] | None = None) -> None:
        """weights_dir: a folder of model folders or several (the first holding a name wins); default
        `denoiser.folders.model_dir.model_roots()`: $DENOISER_WEIGHTS, then the checkout's weights/."""
        self.weights_dir = model_roots() if weights_dir is None else weights_dir
        self._models: dict[str, LoadedModel] = {}
        self._lock = threading.Lock()
        self._tile_rates: dict[str, float] = {}  # model -> tiles a second of its photo denoise here (measured once)
        self._rate_lock = threading.Lock()
        self.views = AttentionViews(self)  # a generation's attention, its words, its heads

    def models(self) -> list[str]:
        return list_models(self.weights_dir)

    def loaded(self, name: str) -> LoadedModel:
        """A model folder under weights/ (its UNet, noise schedule, text model and defaults), loaded once; refuses
        other paths."""
        return self._load(find_model(str(name), self.weights_dir, paths=False))

    def _load(self, folder: Path) -> LoadedModel:
        """A model folder (a served model or the guide its sampling.json names), loaded once."""
        key = str(Path(folder).resolve())
        with self._lock:
            if key not in self._models:
                self._models[key] = load(folder)
            return self._models[key]

    def defaults(self, name: str) -> ModelDefaults:
        """What a model's folder says (class names, example prompts, whether it ships a guide). The values a request
        leaves unset come from it in one place, `plan` (denoiser.sampling.plan.resolve): read them from a plan."""
        return self.loaded(name).defaults

    def classes(self, name: str) -> list[str]:
        """Class names of a class-conditional model (from its card's classes.txt, else indices)."""
        return list(self.defaults(name).classes)

    def plan(self, model: str, request: SampleRequest) -> Plan:
        """`request` for `model`, resolved once against its loaded model: what it leaves unset is the folder's (its
        sampler where the app offers it, APP_SCHEDULERS, else BUILT_IN's; its steps; its sampling.json's guidance, PAG
        layers, interval and guide). One batch: the attention views re-run a step's UNet call on the whole batch."""
        request = dataclasses.replace(request, batch_size=request.num_images)
        return resolve(request, self.loaded(model), load=self._load, samplers=APP_SCHEDULERS)

    def generate(self, model: str, request: SampleRequest, *, plan: Plan | None = None,
                 on_step: Callable[[int, int, torch.Tensor], None] | None = None) -> Generation:
        """Sample `request` (denoiser.request.SampleRequest: the Sample tab's form, ModelForm.request, or a word edit's);
        `on_step(i, total, x0_preview)` sees the predicted x₀ (in [0, 1]) after each step. `plan`: the request resolved
        and checked already (the page's handlers do, before the job starts), else resolved here, and a request over
        the work budget refused before any work (plan_work). The Generation keeps the request, its steps the plan's,
        to sample it again (the Heads tab's layers switched off)."""
        if plan is None:
            plan = self.plan(model, request)
            plan_work(plan).check()
        inputs, timesteps = [], []
        record = _recorder(inputs, timesteps, on_step, lambda i: plan.steps)
        res = run(plan, callback=record)
        replay = dataclasses.replace(request, steps=plan.steps)
        return Generation(model, res.images, inputs, timesteps, plan.labels, plan.guidance, replay,
                          **_text_fields(plan), precision=plan.precision.name)

    def restore_request(self, operation: str, class_label: int | None = None, guidance_scale: float = 1.0,
                        pag_scale: float = 0.0, sigma: float = 0.0, strength: float | None = None, add_noise: float = 0.0,
                        steps: int | None = None, seed: int = 0, prompt: str | None = None,
                        negative_prompt: str | None = None) -> RestoreRequest:
        """The Photo tab's form as a RestoreRequest, each value checked against the page's LIMITS (an API call is held
        to what the page allows): operation one of RESTORE_OPERATIONS; sigma 0: estimated; add_noise 0: none;
        strength, steps None: BUILT_IN's."""
        if operation not in RESTORE_OPERATIONS:
            raise ValueError(f"operation must be one of {', '.join(RESTORE_OPERATIONS)}, got {str(operation)[:40]!r}")
        kind, method = RESTORE_OPERATIONS[operation]
        if class_label is not None:
            class_label = check_int("class", class_label, 0, 2**31 - 1)
        amounts = {}
        for name, label, value in (("sigma", "noise σ", sigma), ("add_noise", "added noise σ", add_noise),
                                   ("strength", "strength", strength)):
            lo, hi = LIMITS[name]
            if value is not None and not (isinstance(value, (int, float)) and (value == 0 or lo <= value <= hi)):
                raise ValueError(f"{label} must be a number in {lo:g}..{hi:g}, got {value!r}")  # NaN fails too
            amounts[name] = None if value is None else float(value)
        prompt, negative_prompt = check_prompt("prompt", prompt), check_prompt("negative prompt", negative_prompt)
        for typed in filter(None, (prompt, negative_prompt)):  # a malformed weight refused before the photo is decoded
            parse_prompt(typed)  # (resolve_restore reads it again once the photo is: the restore plan needs the photo)
        return check_request(RestoreRequest(
            kind, method, sigma=amounts["sigma"], add_noise=amounts["add_noise"],
            strength=amounts["strength"] if kind == "edit" else None,
            steps=None if steps is None else check_int("steps", steps, *LIMITS["steps"]),
            seed=check_int("seed", seed, *LIMITS["seed"]), classes=class_label, prompts=prompt,
            negative_prompts=negative_prompt, guidance=GuidanceRequest(**check_scales(guidance_scale, pag_scale, 1.0))))

    def restore(
        self, model: str, request: RestoreRequest, image: Image.Image, mask: Image.Image | None = None,
        on_step: Callable[[int, int, torch.Tensor], None] | None = None,
    ) -> tuple[Generation | None, RestoreResult]:
        """The user's picture through `request` (denoiser.restore.plan: one rule for tiles or the centre square, the
        class, prompt and guidance as for sampling), within the budgets: a photo whose tiled denoise is over the photo
        budget (denoiser.app.photo_time) is restored as a copy scaled down to fit (the result's settings say
        `scaled_from`); a chain over the work budget is refused before any work. on_step(i, total, preview in [0, 1]) after each step of a chain (its predicted x₀) or each
        batch of tiles (the photo with the rows finished so far, at most PREVIEW_SIDE a side).
        Returns the chain's Generation (the attention views open it; None for tiles) and what was done."""
        loaded = self.loaded(model)
        plan = resolve_restore(request, loaded, image, mask, empty_mask_ok=False,  # the page's empty mask: nothing painted
                               load=self._load)
        if plan.tiled:
            passes = plan.sampling.guidance.passes_per_step()
            fits = self.fitting_pixels(model, *image.size, passes=passes)
            if fits < image.width * image.height:  # over the photo budget: a copy scaled down to fit, the result says so
                plan = resolve_restore(request, loaded, image, mask, max_pixels=fits, load=self._load)
            photo = pil_to_tensor(plan.image)  # (3, H, W) uint8
            out = photo.clone()  # filled with the result band by band: the preview shows how far it is
            stride = max(1, -(-max(photo.shape[1:]) // PREVIEW_SIDE))  # every stride-th pixel: a cheap small preview

            def progress(done: int, total: int) -> None:
                on_step(done - 1, total, uint8_to_unit(out[None, :, ::stride, ::stride]))  # (1, 3, h, w)

            return None, run_restore(plan, progress=None if on_step is None else progress, out=out)
        self.check_work(loaded.unet, 1, plan.steps, plan.sampling.guidance)
        text = _text_fields(plan.sampling) if plan.request.prompts else {}  # encoded once: the chain and the views
        inputs, timesteps = [], []
        record = _recorder(inputs, timesteps, on_step, lambda i: max(plan.steps, i + 1))
        done = run_restore(plan, callback=record)
        gen = Generation(model, done.sample.images, inputs, timesteps, plan.sampling.labels, plan.sampling.guidance, **text,
                         precision=plan.sampling.precision.name)
        return gen, done

    def guide(self, name: str):
        """The autoguidance guide a model folder names in its sampling.json (loaded once), or None."""
        if "guide_model" not in (self.defaults(name).guidance or {}):
            return None
        return self.plan(name, SampleRequest(num_images=1, guidance=GuidanceRequest(guide_scale=2.0))).guidance.guide

    def check_work(self, unet, num_images: int, steps: int, guidance: Guidance | None = None, timesteps=None) -> None:
        """Refuse, before any work, a request larger than the budget (work_of counts it), so one request cannot hold
        the only sampling slot for long. DENOISER_WORK_BUDGET changes the budget."""
        work_of(unet, num_images, steps, guidance, timesteps).check()

    def photo_time(self, model: str, width: int, height: int, passes: float = 1.0) -> PhotoTime:
        """How long denoising a width x height photo in tiles takes here (`passes` UNet calls a tile), against the
        photo budget (denoiser.app.photo_time)."""
        unet = self.loaded(model).unet
        return PhotoTime(count_tiles(unet, height, width), self.tile_rate(model), photo_seconds(), passes)

    def tile_rate(self, model: str) -> float:
        """Tiles a second of `model`'s photo denoise on this server's path, measured once (about a second)."""
        loaded = self.loaded(model)
        with self._rate_lock:  # one measurement at a time: two at once would each time the other's work too
            if model not in self._tile_rates:
                self._tile_rates[model] = measure_tile_rate(loaded.unet, loaded.noise_schedule)
            return self._tile_rates[model]

    def fitting_pixels(self, model: str, width: int, height: int, passes: float = 1.0) -> int:
        """The most pixels a copy of a width x height photo may keep (its shape kept) for its tiled denoise to fit the
        photo budget and MAX_PIXELS: the photo's own where it fits."""
        def fits(scale: float) -> bool:
            w, h = max(1, int(width * scale)), max(1, int(height * scale))
            return w * h <= MAX_PIXELS and not self.photo_time(model, w, h, passes).over

        if fits(1.0):
            return width * height
        lo, hi = 0.0, 1.0  # fits(lo), not fits(hi): halve the gap to a pixel's width
        while (hi - lo) * max(width, height) > 0.5:
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if fits(mid) else (lo, mid)
        return max(1, int(width * lo)) * max(1, int(height * lo))

    def photo_limit(self, model: str) -> float:
        """The most megapixels a photo may have for `model`'s tiled denoise within the photo budget (a square photo's
        tiles counted; a long thin one has a few more) and image_io's MAX_PIXELS: a larger photo is denoised as a copy
        scaled down to this (restore), and the page says so before an upload."""
        one = self.photo_time(model, 1000, 1000)  # one (square) megapixel
        return min(MAX_PIXELS / 1e6, one.budget / one.seconds)


def check_prompt(name: str, value) -> str | None:
    """A prompt from the page: text of at most MAX_PROMPT_CHARS; None or blank: no prompt. Its weights ("(red:1.5)
    apple") are read once, by the plan (denoiser.sampling.plan.resolve), which refuses a malformed one before any work."""
    if value is None:
        return None
    if not isinstance(value, str) or len(value) > MAX_PROMPT_CHARS:
        raise ValueError(f"the {name} must be text of at most {MAX_PROMPT_CHARS} characters, got "
                         f"{type(value).__name__} of length {len(str(value))}")
    return value.strip() or None


def _text_fields(plan: Plan) -> dict:
    """A Generation's text fields from its plan: the encoded prompts of the whole batch (an edit counting its steps on
    the plan's timesteps, as sampling did), the prompt, each image's words and their weights, the prompt's words past
    the tokenizer's length (which the model never read) and those no training caption held (which it guesses)."""
    if plan.text is None:
        return {}
    prompt = plan.prompts[0] if plan.prompts else ""
    n = range(plan.num_images)
    return dict(text=plan.text_condition(n), prompt=prompt, words=plan.words(0),
                image_words=tuple(plan.words(k) for k in n), word_weights=tuple(plan.word_weights(k) for k in n),
                unread=plan.unread(0), unseen=plan.unseen(0), notes=tuple(plan.image_notes(0)))


def _recorder(inputs: list, timesteps: list, on_step, total: Callable[[int], int]):
    """A sampling callback that keeps every step's model input and timestep (the attention view re-runs them)
    and reports progress as on_step(i, total(i), x₀ preview in [0, 1])."""

    def record(i: int, t: int, x_t: torch.Tensor, x0: torch.Tensor) -> None:
        inputs.append(x_t.detach().clone())
        timesteps.append(t)
        if on_step is not None:
            on_step(i, total(i), to_unit(x0))

    return record

"""The web app's engine, without the web: models by name, generation with previews, your images restored,
then any pixel's attention, the heads' statistics and layers switched off. Returns tensors, images and
plain data; the words and Markdown a page shows are the handlers' (denoiser/app/handlers.py).
The attention views and the Generation they read are in denoiser/app/attention_views.py (AttentionViews, a
mixin Engine inherits).

Sampling runs the fused attention path and keeps only the model inputs x_t of every step (a few MB).
Opening the attention view for a step re-runs that step's UNet call on the same batch under
`capture_attention`: the same inputs and shapes give bit-identical q and k, so the weights shown are
the exact weights of the sampling pass, rebuilt for the clicked pixel only (O(N·d) memory per layer).
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from PIL import Image

from denoiser.app.attention_views import AttentionViews, Generation, Stages
from denoiser.app.budget import Work, plan_work, work_of
from denoiser.app.limits import LIMITS, check_int, check_scales
from denoiser.diffusion import Diffusion
from denoiser.guidance import Guidance
from denoiser.image_io import MAX_PIXELS, uint8_to_pil
from denoiser.model_dir import list_models, load_model, model_roots, resolve_model_dir
from denoiser.pixels import to_uint8, to_unit, uint8_to_unit
from denoiser.prompt_edit import PromptEdit
from denoiser.prompt_weights import parse_prompt
from denoiser.request import BUILT_IN, SampleRequest, check_timestep_spacing
from denoiser.restore import restore
from denoiser.sample import SAMPLERS
from denoiser.sampling import ModelDefaults, Plan, read_defaults, resolve, run
from denoiser.tiles import TileOptions, count_tiles, denoise_photo

__all__ = ["Engine", "Generation", "Restored", "DenoisedTiles", "Stages", "SCHEDULERS", "RESTORE_OPERATIONS",
           "restore_prompts", "takes_prompt"]

# what the Edit tab does to a user's image (denoiser.restore) -> (operation, method); "denoise" is the one-step
# MMSE estimate, "denoise (sampled)" the reverse chain
RESTORE_OPERATIONS = {"denoise": ("denoise", "mmse"), "denoise (sampled)": ("denoise", "sample"),
                      "edit": ("edit", "mmse"), "inpaint": ("inpaint", "mmse")}

# the samplers with integer timesteps: the attention view re-runs a step's exact UNet call
SCHEDULERS = tuple(name for name, s in SAMPLERS.items() if s.integer_timesteps)

# a tile's work besides its UNet call (cut, moved, blended), in work units: measured (bench/app_photo_limit.md), it is
# 2.2 ms a tile on 2 cores, as much as 0.6 units of UNet work; small models (synthetic-shapes: 0.25 units a tile)
# would otherwise get a megapixel limit 3x too high for the budget's time
TILE_UNITS = 0.6
PREVIEW_SIDE = 256  # a tiled denoise's live preview: at most this many pixels a side

@dataclass
class Restored:
    """What restoring a user's image did, for the page to say."""

    operation: str
    input_size: tuple[int, int]  # (width, height) of the user's image
    size: int  # the model's sample size it was resized and cropped to
    steps: int  # timesteps the chain visited
    psnr: tuple[float, float] | None  # (noisy, result) in dB against the image, when noise was added first
    sigma: float | None = None  # the noise σ denoise removed ([0, 1] pixel scale: the one given, or estimated)


@dataclass
class DenoisedTiles:
    """A photo denoised at its own size in tiles (Engine.denoise_tiles), for the page to show and say."""

    image: Image.Image  # the result, at the photo's size
    sigma: float  # the noise σ removed ([0, 1] pixel scale: the one given, or estimated on the photo)
    tiles: int  # UNet images it took
    tile: int  # tile side in pixels (the model's sample size)


class Engine(AttentionViews):
    """Models under folders of model folders, loaded once; generation and attention views."""

    def __init__(self, weights_dir: str | Path | Sequence[str | Path] | None = None) -> None:
        """weights_dir: a folder of model folders or several (the first holding a name wins); default
        `denoiser.model_dir.model_roots()`: $DENOISER_WEIGHTS, then the checkout's weights/."""
        self.weights_dir = model_roots() if weights_dir is None else weights_dir
        self._models: dict[str, tuple] = {}
        self._lock = threading.Lock()

    def models(self) -> list[str]:
        return list_models(self.weights_dir)

    def model(self, name: str):
        """(unet, training scheduler) of a model folder under weights/, cached; refuses other paths."""
        return self._load(resolve_model_dir(str(name), self.weights_dir))

    def _load(self, folder: Path) -> tuple:
        """A model folder (a served model or the guide its sampling.json names), loaded once."""
        key = str(Path(folder).resolve())
        with self._lock:
            if key not in self._models:
                self._models[key] = load_model(folder)
            return self._models[key]

    def defaults(self, name: str) -> ModelDefaults:
        """What a model's folder says about sampling it (scheduler, steps, guidance, class names)."""
        unet, _ = self.model(name)
        return read_defaults(resolve_model_dir(str(name), self.weights_dir), unet.config.num_class_embeds)

    def classes(self, name: str) -> list[str]:
        """Class names of a class-conditional model (from its card's classes.txt, else indices)."""
        return list(self.defaults(name).classes)

    def plan(self, model: str, request: SampleRequest) -> Plan:
        """The page's request for `model`, resolved against its folder (its sampling.json fills what the page
        leaves unset: PAG layers, the guidance interval, the guide model)."""
        return resolve(request, resolve_model_dir(str(model), self.weights_dir), load=self._load)

    def generate(
        self,
        model: str,
        scheduler: str | None = None,
        steps: int | None = None,
        seed: int = 0,
        num_images: int = 4,
        class_label: int | None = None,
        eta: float = 0.0,
        on_step: Callable[[int, int, torch.Tensor], None] | None = None,
        guidance_scale: float = 1.0,
        pag_scale: float = 0.0,
        guide_scale: float = 1.0,
        timestep_spacing: str | None = None,
        guidance_interval: str | tuple[float, float] | None = None,
        pag_layers: str | tuple[str, ...] | None = None,
        prompt: str | None = None,
        negative_prompt: str | None = None,
        edit: PromptEdit | None = None,
        edit_prompt: str | None = None,
    ) -> Generation:
        """Sample; `on_step(i, total, x0_preview)` sees the predicted x₀ (in [0, 1]) after each step.

        guidance_scale, pag_scale, guide_scale: classifier-free, perturbed-attention and autoguidance
        (denoiser.guidance); autoguidance uses the guide named in the model folder's sampling.json.
        timestep_spacing, guidance_interval ("lo, hi" timesteps), pag_layers ("a,b"): None or empty, the model's.
        prompt, negative_prompt: a text model's (None or empty: no condition; classifier-free guidance steers from
        the negative prompt to the prompt). edit, edit_prompt: a prompt-to-prompt edit (denoiser.prompt_edit): image 0
        `prompt` (the source), image 1 `edit_prompt`, both from image 0's noise (num_images 2). A request over the work
        budget is refused before any work (plan_work)."""
        form = dict(scheduler=scheduler, steps=steps, seed=seed, num_images=num_images, class_label=class_label,
                    eta=eta, guidance_scale=guidance_scale, pag_scale=pag_scale, guide_scale=guide_scale,
                    timestep_spacing=timestep_spacing, guidance_interval=guidance_interval, pag_layers=pag_layers,
                    prompt=prompt, negative_prompt=negative_prompt, edit=edit, edit_prompt=edit_prompt)
        plan = self.sample_plan(model, **form)
        plan_work(plan).check()
        inputs, timesteps = [], []
        record = _recorder(inputs, timesteps, on_step, lambda i: plan.steps)
        res = run(plan, callback=record)
        replay = {**form, "steps": plan.steps}  # the request again: ablate samples it with layers off
        return Generation(model, res.images, inputs, timesteps, plan.labels, plan.guidance, replay,
                          **_text_fields(plan))

    def sample_plan(self, model: str, scheduler: str | None, steps: int | None, seed: int, num_images: int,
                    class_label: int | None, eta: float, guidance_scale: float, pag_scale: float, guide_scale: float,
                    timestep_spacing: str | None, guidance_interval: str | tuple[float, float] | None,
                    pag_layers: str | tuple[str, ...] | None, prompt: str | None = None,
                    negative_prompt: str | None = None, edit: PromptEdit | None = None,
                    edit_prompt: str | None = None) -> Plan:
        """generate()'s arguments checked (each against the page's LIMITS) and resolved against the model's folder:
        the plan generate samples, and whose work (plan_work) the page's budget note shows."""
        if steps is not None:  # None: the folder's (sampling.json), else BUILT_IN
            steps = check_int("steps", steps, *LIMITS["steps"])
        num_images = check_int("number of images", num_images, *LIMITS["num_images"])
        seed = check_int("seed", seed, *LIMITS["seed"])
        if scheduler is None:  # the folder's sampler where the attention view can replay it, else BUILT_IN's
            scheduler = own if (own := self.defaults(model).scheduler) in SCHEDULERS else BUILT_IN["scheduler"]
        if scheduler not in SCHEDULERS:
            raise ValueError(f"scheduler must be one of {', '.join(SCHEDULERS)}, got {scheduler!r}")
        if class_label is not None:  # a form value as a number; the UNet checks it is one of the model's classes
            class_label = check_int("class", class_label, 0, 2**31 - 1)
        scales = check_scales(guidance_scale, pag_scale, guide_scale)
        timestep_spacing = check_timestep_spacing(timestep_spacing)
        if not isinstance(eta, (int, float)) or not 0 <= eta <= 1:
            raise ValueError(f"eta must be a number in 0..1, got {eta!r}")
        prompt, negative_prompt = _check_prompt("prompt", prompt), _check_prompt("negative prompt", negative_prompt)
        prompts = prompt
        if edit is not None:  # the source and its edit, one batch (denoiser.sampling checks the rest before any work)
            edit_prompt = _check_prompt("edited prompt", edit_prompt)
            if not edit_prompt:
                raise ValueError("type the edited prompt: the result's prompt with the words you want changed (red heart "
                                 "→ blue heart)")
            prompts = [prompt or "", edit_prompt]
        request = SampleRequest(num_images=num_images, classes=class_label, prompts=prompts, negative_prompts=negative_prompt,
                                seed=seed, batch_size=num_images, edit=edit,
                                scheduler=scheduler, steps=steps, timestep_spacing=timestep_spacing, eta=float(eta),
                                guidance_interval=guidance_interval or None, pag_layers=pag_layers or None, **scales)
        return self.plan(model, request)

    def restore(
        self,
        model: str,
        operation: str,
        image: Image.Image,
        mask: Image.Image | None = None,
        sigma: float = 0.0,
        strength: float = 0.3,
        add_noise: float = 0.0,
        steps: int = 50,
        seed: int = 0,
        class_label: int | None = None,
        guidance_scale: float = 1.0,
        on_step: Callable[[int, int, torch.Tensor], None] | None = None,
        pag_scale: float = 0.0,
        guide_scale: float = 1.0,
        prompt: str | None = None,
        negative_prompt: str | None = None,
    ) -> tuple[Generation, Image.Image | None, Restored]:
        """Denoise, edit or inpaint the user's image (`denoiser.restore.restore`) as a Generation the attention
        view opens.

        operation: one of RESTORE_OPERATIONS. sigma: the noise σ of the image for denoising (0: estimated).
        strength: how far "edit" noises the image before redrawing it (0..1). mask: for "inpaint", white (or painted, opaque) pixels are regenerated.
        prompt, negative_prompt: a text model's, for edit and inpaint (what the redrawn pixels follow; None or
        empty: unconditioned, where classifier-free guidance has nothing to steer by).
        Returns the generation (its image, every step's model input), the noisy input when `add_noise` > 0,
        and what was done.
        """
        kind, method, steps, seed = _restore_request(operation, image, steps, seed, sigma, strength, add_noise)
        if class_label is not None:
            class_label = check_int("class", class_label, 0, 2**31 - 1)
        scales = check_scales(guidance_scale, pag_scale, guide_scale)
        prompt, negative_prompt = restore_prompts(operation, prompt, negative_prompt)
        if scales["guidance_scale"] != 1.0 and self.is_text(model) and not prompt:
            raise ValueError(f"{model} is a text model: without a prompt it runs unconditioned, where classifier-free "
                             "guidance has nothing to steer by: type a prompt (edit, inpaint) or set guidance to 1")
        # the guidance, class and prompt as for sampling; the chain itself is the restore operation's
        plan = self.plan(model, SampleRequest(num_images=1, classes=class_label, prompts=prompt,
                                              negative_prompts=negative_prompt, **scales))
        unet, train_sched = self.model(model)
        self.check_work(unet, 1, steps, plan.guidance)
        text = _text_fields(plan) if prompt else {}  # the prompt encoded once: the chain and the attention views
        # steps the chain will take (denoiser.restore visits at most this many timesteps), for progress
        expected = {"denoise": 1 if method == "mmse" else steps, "edit": max(1, round(steps * strength))}.get(kind, steps)
        inputs, timesteps = [], []
        record = _recorder(inputs, timesteps, on_step, lambda i: max(expected, i + 1))
        res = restore(  # the page's empty mask (nothing painted) is refused before any work
            unet, Diffusion(train_sched), image, kind, mask=mask, sigma=sigma if sigma > 0 else None, method=method,
            strength=strength, noise_first=add_noise if add_noise > 0 else None, steps=steps, seed=seed,
            class_label=plan.labels, guidance=plan.guidance, callback=record, empty_mask_ok=False,
            text=text.get("text"),
        )
        gen = Generation(model, res.result.images, inputs, timesteps, plan.labels, plan.guidance, **text)
        noisy = None if res.noisy is None else _to_image(to_unit(res.noisy))
        done = Restored(operation, image.size, unet.config.sample_size, len(timesteps), res.psnr(), res.sigma)
        return gen, noisy, done

    def sampling_defaults(self, name: str) -> tuple[dict, bool]:
        """(the model folder's sampling.json guidance, whether it names a guide for autoguidance)."""
        guidance = dict(self.defaults(name).guidance or {})
        return guidance, "guide_model" in guidance

    def guide(self, name: str):
        """The autoguidance guide a model folder names in its sampling.json (loaded once), or None."""
        if not self.sampling_defaults(name)[1]:
            return None
        return self.plan(name, SampleRequest(num_images=1, guide_scale=2.0)).guidance.guide

    def check_work(self, unet, num_images: int, steps: int, guidance: Guidance | None = None, timesteps=None) -> None:
        """Refuse, before any work, a request larger than the budget (work_of counts it), so one request cannot hold
        the only sampling slot for long. DENOISER_WORK_BUDGET changes the budget."""
        work_of(unet, num_images, steps, guidance, timesteps).check()

    def photo_work(self, model: str, width: int, height: int) -> Work:
        """The work of denoising a width x height photo in tiles: one UNet call per tile by the budget's one rule
        (work_of), plus TILE_UNITS a tile for cutting, moving and blending it."""
        unet, _ = self.model(model)
        work = work_of(unet, count_tiles(unet, height, width), 1)
        return dataclasses.replace(work, per_step=work.per_step + TILE_UNITS)

    def photo_limit(self, model: str) -> float:
        """The most megapixels a photo may have for `model`'s tiled denoise within the work budget (a square photo's
        tiles counted; a long thin one has a few more) and image_io's MAX_PIXELS: what the page shows before an upload."""
        per_mp = self.photo_work(model, 1000, 1000).units  # the work of one (square) megapixel
        return min(MAX_PIXELS / 1e6, self.photo_work(model, 1000, 1000).budget / per_mp)

    def check_photo(self, model: str, width: int, height: int) -> None:
        """Refuse, before any work, a photo whose tiled denoise is over the work budget: its size, the limit, the fix."""
        work = self.photo_work(model, width, height)
        if work.over:
            raise ValueError(
                f"your photo is {width}x{height} ({width * height / 1e6:.1f} megapixels): denoising it with {model} takes "
                f"{work.num_images:,} tiles, over the work budget; at most about {self.photo_limit(model):.1f} megapixels "
                "with this model: upload a smaller copy, or choose an operation that works on the centre square"
            )

    def denoise_tiles(self, model: str, image: Image.Image, sigma: float | None = None,
                      on_step: Callable[[int, int, torch.Tensor], None] | None = None) -> DenoisedTiles:
        """A picture of any size denoised at its own size (denoiser.tiles.denoise_photo); sigma None: estimated.
        Refused over the work budget before any work (check_photo). on_step(i, total, preview) after each batch of
        tiles, i counting tiles (0-based: the last tile done) of `total`; preview (1, 3, h, w) in [0, 1]: the rows
        finished so far over the rest of the photo, at most PREVIEW_SIDE pixels a side."""
        from torchvision.transforms.functional import pil_to_tensor

        unet, train_sched = self.model(model)
        photo = pil_to_tensor(image.convert("RGB"))  # (3, H, W) uint8
        self.check_photo(model, photo.shape[2], photo.shape[1])
        out = photo.clone()  # filled with the result row band by row band: the preview shows how far it is
        stride = max(1, -(-max(photo.shape[1:]) // PREVIEW_SIDE))  # every stride-th pixel: a cheap small preview

        def progress(done: int, total: int) -> None:
            on_step(done - 1, total, uint8_to_unit(out[None, :, ::stride, ::stride]))  # (1, 3, h, w)

        res = denoise_photo(unet, train_sched, photo, sigma, options=TileOptions(), out=out,
                            progress=None if on_step is None else progress)
        return DenoisedTiles(uint8_to_pil(res.result), res.sigma, count_tiles(unet, *photo.shape[1:]),
                             unet.config.sample_size)


MAX_PROMPT_CHARS = 1000  # a prompt longer than this is refused (the tokenizer keeps its first max_length words anyway)


def _check_prompt(name: str, value) -> str | None:
    """A prompt from the page: text of at most MAX_PROMPT_CHARS whose weights read ("(red:1.5) apple": a malformed
    one is refused here, before any work, in denoiser.prompt_weights' words); None or blank: no prompt."""
    if value is None:
        return None
    if not isinstance(value, str) or len(value) > MAX_PROMPT_CHARS:
        raise ValueError(f"the {name} must be text of at most {MAX_PROMPT_CHARS} characters, got "
                         f"{type(value).__name__} of length {len(str(value))}")
    parse_prompt(value)  # the Edit tab's prompt, read before its photo is
    return value.strip() or None


def takes_prompt(operation: str) -> bool:
    """Whether a restore operation follows a text model's prompt: edit and inpaint redraw pixels; a denoise keeps
    what the picture shows."""
    return RESTORE_OPERATIONS.get(operation, ("",))[0] in ("edit", "inpaint")


def restore_prompts(operation: str, prompt, negative_prompt) -> tuple[str | None, str | None]:
    """The Edit form's prompts, checked before any work: for edit and inpaint (what the redrawn pixels follow); a
    denoise keeps what the picture shows, so it takes none."""
    prompt, negative_prompt = _check_prompt("prompt", prompt), _check_prompt("negative prompt", negative_prompt)
    if (prompt or negative_prompt) and not takes_prompt(operation):
        raise ValueError("a prompt steers edit and inpaint; denoise removes the noise and keeps what your picture "
                         "shows: leave the prompt empty, or pick edit or inpaint")
    return prompt, negative_prompt


def _text_fields(plan: Plan) -> dict:
    """A Generation's text fields from its plan: the encoded prompts of the whole batch (an edit counting its steps on
    the plan's timesteps, as sampling did), the prompt, each image's words and their weights, and the prompt's
    words past the tokenizer's length (which the model never read)."""
    if plan.text is None:
        return {}
    prompt = plan.prompts[0] if plan.prompts else ""
    n = range(plan.num_images)
    return dict(text=plan.text_condition(n), prompt=prompt, words=plan.words(0),
                image_words=tuple(plan.words(k) for k in n), word_weights=tuple(plan.word_weights(k) for k in n),
                unread=tuple(plan.text[0].dropped(parse_prompt(prompt).text)))


def _restore_request(operation: str, image: Image.Image | None, steps, seed, sigma, strength, add_noise) -> tuple:
    """The Edit tab's form, checked before any work: (operation kind, method, steps, seed)."""
    if operation not in RESTORE_OPERATIONS:
        raise ValueError(f"operation must be one of {', '.join(RESTORE_OPERATIONS)}, got {str(operation)[:40]!r}")
    if image is None:
        raise ValueError("upload an image first")
    if image.width * image.height > MAX_PIXELS:
        raise ValueError(f"the image is {image.width}x{image.height}: at most {MAX_PIXELS // 1_000_000} megapixels")
    steps = check_int("steps", steps, *LIMITS["steps"])
    seed = check_int("seed", seed, *LIMITS["seed"])
    for name, value in (("noise σ", sigma), ("strength", strength), ("added noise σ", add_noise)):
        if not isinstance(value, (int, float)) or not 0 <= value <= 1:  # NaN fails too
            raise ValueError(f"{name} must be a number in 0..1, got {value!r}")
    kind, method = RESTORE_OPERATIONS[operation]
    if kind == "edit" and strength == 0:
        raise ValueError("edit strength 0 keeps the image as it is: choose a strength above 0")
    return kind, method, steps, seed


def _recorder(inputs: list, timesteps: list, on_step, total: Callable[[int], int]):
    """A sampling callback that keeps every step's model input and timestep (the attention view re-runs them)
    and reports progress as on_step(i, total(i), x₀ preview in [0, 1])."""

    def record(i: int, t: int, x_t: torch.Tensor, x0: torch.Tensor) -> None:
        inputs.append(x_t.detach().clone())
        timesteps.append(t)
        if on_step is not None:
            on_step(i, total(i), to_unit(x0))

    return record


def _to_image(x: torch.Tensor) -> Image.Image:
    """(1, 3, H, W) in [0, 1] -> PIL."""
    return uint8_to_pil(to_uint8(x[0]))

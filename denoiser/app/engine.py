"""The web app's engine, without the web: models by name, generation with previews, your images restored,
then any pixel's attention, the heads' statistics and layers switched off. Returns tensors, images and
plain data; the words and Markdown a page shows are the handlers' (denoiser/app/handlers.py).

Sampling runs the fused attention path and keeps only the model inputs x_t of every step (a few MB).
Opening the attention view for a step re-runs that step's UNet call on the same batch under
`capture_attention`: the same inputs and shapes give bit-identical q and k, so the weights shown are
the exact weights of the sampling pass, rebuilt for the clicked pixel only (O(N·d) memory per layer).
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
from PIL import Image

from denoiser.app.budget import Work, plan_work, work_of
from denoiser.attention import (
    AttentionRecord,
    MultiHeadSelfAttention,
    attention_layer_names,
    capture_attention,
    identity_attention,
)
from denoiser.attention_stats import LayerStats, attention_stats, stats_chart
from denoiser.diffusion import Diffusion
from denoiser.guidance import Guidance, TextCondition
from denoiser.image_io import MAX_PIXELS, uint8_to_pil
from denoiser.model_dir import list_models, load_model, model_roots, resolve_model_dir
from denoiser.pixels import to_uint8, to_unit, uint8_to_unit, unit_to_model
from denoiser.request import BUILT_IN, SampleRequest, check_timestep_spacing
from denoiser.restore import restore
from denoiser.sample import SAMPLERS, sampling_context
from denoiser.sampling import ModelDefaults, Plan, read_defaults, resolve, run
from denoiser.tiles import TileOptions, count_tiles, denoise_photo
from denoiser.visualize import attention_panel, layer_label, maps_panel, stages_panel

__all__ = ["Engine", "Generation", "Restored", "DenoisedTiles", "Stages", "LIMITS", "SCHEDULERS", "RESTORE_OPERATIONS"]

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

LIMITS = {"steps": (1, 1000), "num_images": (1, 64), "seed": (0, 2**32 - 1), "guidance_scale": (1.0, 10.0),
          "pag_scale": (0.0, 10.0), "guide_scale": (1.0, 10.0)}


class StepAttention:
    """The exact attention of one denoising step of a generation, kept until another step is asked for: a
    session's memory stays bounded however many steps it opens."""

    def __init__(self) -> None:
        self._step: int | None = None
        self._records: list[AttentionRecord] = []

    def get(self, step: int, capture: Callable[[], list[AttentionRecord]]) -> list[AttentionRecord]:
        """Step `step`'s records, from `capture()` unless they are the ones kept."""
        if step != self._step:
            self._step, self._records = None, []  # the old step's records go before the new ones are made
            self._records, self._step = capture(), step
        return self._records

    def __len__(self) -> int:
        return 0 if self._step is None else 1


@dataclass
class Generation:
    """One sampling run of one session: final images and every step's model input."""

    model: str
    images: torch.Tensor  # (B, 3, H, W) in [0, 1]
    inputs: list[torch.Tensor]  # x_t fed to the UNet at each step, (B, C, H, W)
    timesteps: list[int]
    labels: torch.Tensor | None
    guidance: Guidance = field(default_factory=Guidance)  # what the images were sampled with
    replay: dict | None = None  # generate()'s arguments, to sample the same seed again (None: an edit)
    attention: StepAttention = field(default_factory=StepAttention, repr=False)  # the latest step's records
    text: TextCondition | None = None  # a text model's encoded prompts (the attention view's re-runs take them)
    prompt: str = ""  # a text model's prompt, the same for every image ("" = no condition)
    words: tuple[str, ...] = ()  # the prompt's words the model sees: one token, one cross-attention map each

    @property
    def num_steps(self) -> int:
        return len(self.timesteps)


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


@dataclass
class Stages:
    """One pixel's attention in one layer and head, stage by stage, for the page to show."""

    layer: str
    head: int
    query: tuple[int, int]  # (y, x) on the layer's grid
    grid: tuple[int, int]  # (H, W) of the layer
    head_dim: int
    step: int
    timestep: int
    score_range: tuple[float, float]  # stage (2): min, max of q·kᵀ/√d
    weight_sum: float  # stage (3): the softmax's weights sum to this (1)
    top: list[tuple[tuple[int, int], float, float]]  # the most attended pixels: ((y, x), score, weight)


def _check_int(name: str, value, lo: int, hi: int) -> int:
    """A whole number in lo..hi (ints, integral floats from sliders, numeric strings), else a clear error."""
    try:
        v = float(value)
    except (TypeError, ValueError):
        v = float("nan")
    if not v.is_integer() or not lo <= v <= hi:
        raise ValueError(f"{name} must be a whole number in {lo}..{hi}, got {value!r}")
    return int(v)


class Engine:
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
    ) -> Generation:
        """Sample; `on_step(i, total, x0_preview)` sees the predicted x₀ (in [0, 1]) after each step.

        guidance_scale, pag_scale, guide_scale: classifier-free, perturbed-attention and autoguidance
        (denoiser.guidance); autoguidance uses the guide named in the model folder's sampling.json.
        timestep_spacing, guidance_interval ("lo, hi" timesteps), pag_layers ("a,b"): None or empty, the model's.
        prompt, negative_prompt: a text model's (None or empty: no condition; classifier-free guidance steers from
        the negative prompt to the prompt). A request over the work budget is refused before any work (plan_work)."""
        form = dict(scheduler=scheduler, steps=steps, seed=seed, num_images=num_images, class_label=class_label,
                    eta=eta, guidance_scale=guidance_scale, pag_scale=pag_scale, guide_scale=guide_scale,
                    timestep_spacing=timestep_spacing, guidance_interval=guidance_interval, pag_layers=pag_layers,
                    prompt=prompt, negative_prompt=negative_prompt)
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
                    negative_prompt: str | None = None) -> Plan:
        """generate()'s arguments checked (each against the page's LIMITS) and resolved against the model's folder:
        the plan generate samples, and whose work (plan_work) the page's budget note shows."""
        if steps is not None:  # None: the folder's (sampling.json), else BUILT_IN
            steps = _check_int("steps", steps, *LIMITS["steps"])
        num_images = _check_int("number of images", num_images, *LIMITS["num_images"])
        seed = _check_int("seed", seed, *LIMITS["seed"])
        if scheduler is None:  # the folder's sampler where the attention view can replay it, else BUILT_IN's
            scheduler = own if (own := self.defaults(model).scheduler) in SCHEDULERS else BUILT_IN["scheduler"]
        if scheduler not in SCHEDULERS:
            raise ValueError(f"scheduler must be one of {', '.join(SCHEDULERS)}, got {scheduler!r}")
        if class_label is not None:  # a form value as a number; the UNet checks it is one of the model's classes
            class_label = _check_int("class", class_label, 0, 2**31 - 1)
        scales = _check_scales(guidance_scale, pag_scale, guide_scale)
        timestep_spacing = check_timestep_spacing(timestep_spacing)
        if not isinstance(eta, (int, float)) or not 0 <= eta <= 1:
            raise ValueError(f"eta must be a number in 0..1, got {eta!r}")
        prompt, negative_prompt = _check_prompt("prompt", prompt), _check_prompt("negative prompt", negative_prompt)
        request = SampleRequest(num_images=num_images, classes=class_label, prompts=prompt, negative_prompts=negative_prompt,
                                seed=seed, batch_size=num_images,
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
    ) -> tuple[Generation, Image.Image | None, Restored]:
        """Denoise, edit or inpaint the user's image (`denoiser.restore.restore`) as a Generation the attention
        view opens.

        operation: one of RESTORE_OPERATIONS. sigma: the noise σ of the image for denoising (0: estimated).
        strength: how far "edit" noises the image before redrawing it (0..1). mask: for "inpaint", white (or painted, opaque) pixels are regenerated.
        Returns the generation (its image, every step's model input), the noisy input when `add_noise` > 0,
        and what was done.
        """
        kind, method, steps, seed = _restore_request(operation, image, steps, seed, sigma, strength, add_noise)
        if class_label is not None:
            class_label = _check_int("class", class_label, 0, 2**31 - 1)
        scales = _check_scales(guidance_scale, pag_scale, guide_scale)
        if scales["guidance_scale"] != 1.0 and self.is_text(model):  # restore takes no prompt: the model runs unconditioned
            raise ValueError(f"{model} is a text model and the Edit tab runs it without a prompt (unconditional), where "
                             "classifier-free guidance has nothing to steer by: set guidance to 1")
        # the guidance and class as for sampling; the chain itself is the restore operation's
        plan = self.plan(model, SampleRequest(num_images=1, classes=class_label, **scales))
        unet, train_sched = self.model(model)
        self.check_work(unet, 1, steps, plan.guidance)
        # steps the chain will take (denoiser.restore visits at most this many timesteps), for progress
        expected = {"denoise": 1 if method == "mmse" else steps, "edit": max(1, round(steps * strength))}.get(kind, steps)
        inputs, timesteps = [], []
        record = _recorder(inputs, timesteps, on_step, lambda i: max(expected, i + 1))
        res = restore(  # the page's empty mask (nothing painted) is refused before any work
            unet, Diffusion(train_sched), image, kind, mask=mask, sigma=sigma if sigma > 0 else None, method=method,
            strength=strength, noise_first=add_noise if add_noise > 0 else None, steps=steps, seed=seed,
            class_label=plan.labels, guidance=plan.guidance, callback=record, empty_mask_ok=False,
        )
        gen = Generation(model, res.result.images, inputs, timesteps, plan.labels, plan.guidance)
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

    def records(self, gen: Generation, step: int, kind: str = "self") -> list[AttentionRecord]:
        """Exact attention of step `step` for the whole batch (re-run under capture, cached per step): the pixel-to-pixel
        ("self") layers, or a text model's pixel-to-word ("cross") layers."""
        step = _check_int("step", step, 0, gen.num_steps - 1)
        return [r for r in gen.attention.get(step, lambda: self._capture(gen, step)) if r.kind == kind]

    def _capture(self, gen: Generation, step: int) -> list[AttentionRecord]:
        unet, _ = self.model(gen.model)
        # the sampling pass's setup (packed weights): the same arithmetic, so the same q and k
        x, labels, B = gen.inputs[step], gen.labels, gen.images.shape[0]
        # the guided call as sampled: the images' own rows first, then "no class" (the negative prompt) and perturbed rows
        with torch.inference_mode(), sampling_context(unet), capture_attention(unet) as recs:
            gen.guidance.main_pass(unet, x, gen.timesteps[step], labels, gen.text)
        # the images' own half, copied: a slice would keep the whole qkv projection (and v) alive
        return [dataclasses.replace(r, q=r.q[:B].clone(), k=r.k[:B].clone(),
                                    key_mask=None if r.key_mask is None else r.key_mask[:B].clone()) for r in recs]

    def attention_maps(self, gen: Generation, image: int, step: int, pixel: tuple[int, int]) -> Image.Image:
        """Every layer's attention of `pixel` (y, x in image coordinates) as overlays, labelled."""
        image = _check_int("image", image, 0, gen.images.shape[0] - 1)
        S = gen.images.shape[-1]
        y, x = (_check_int("pixel y", pixel[0], 0, S - 1), _check_int("pixel x", pixel[1], 0, S - 1))
        return attention_panel(gen.images[image], self.records(gen, step), (y, x), batch_index=image)

    def is_text(self, name: str) -> bool:
        """Whether a model takes a prompt (its UNet has cross-attention) rather than classes."""
        return getattr(self.model(name)[0].config, "cross_attention_dim", None) is not None

    def _word(self, gen: Generation, word) -> int:
        if not gen.words:
            raise ValueError("this generation has no prompt: its words' maps need a text model and a prompt")
        return _check_int(f"word (0..{len(gen.words) - 1}, of {' '.join(gen.words)[:80]!r})", word, 0, len(gen.words) - 1)

    def word_maps(self, gen: Generation, image: int, step: int, word: int) -> list[tuple[str, torch.Tensor]]:
        """Word `word` of the prompt: its map over the pixels in every cross-attention layer at `step`, as
        (layer label, weights (h, H, W)): each pixel's share of attention that goes to the word."""
        image = _check_int("image", image, 0, gen.images.shape[0] - 1)
        j = self._word(gen, word)
        return [(layer_label(r), r.token_map(j)[image]) for r in self.records(gen, step, "cross")]

    def word_weights(self, gen: Generation, image: int, step: int, pixel: tuple[int, int]) -> list[tuple[str, torch.Tensor]]:
        """One pixel's weights over the prompt's words in every cross-attention layer at `step`, as (layer label,
        weights (h, words)); empty for a generation without a prompt."""
        image = _check_int("image", image, 0, gen.images.shape[0] - 1)
        S = gen.images.shape[-1]
        y, x = (_check_int("pixel y", pixel[0], 0, S - 1), _check_int("pixel x", pixel[1], 0, S - 1))
        if not gen.words:
            return []
        out = []
        for r in self.records(gen, step, "cross"):
            H, W = r.size
            out.append((layer_label(r), r.weights((y * H // S, x * W // S))[image, :, : len(gen.words)]))  # (h, words)
        return out

    def check_layer(self, gen: Generation, layer) -> int:
        """The layer selector's value (an index among the generation's attention layers: an int, or text a person
        typed such as "3") as that index; anything else is refused in words naming how many layers there are."""
        count = len(attention_layer_names(self.model(gen.model)[0]))
        try:
            index = float(str(layer).strip()) if isinstance(layer, str) else float(layer)
        except (TypeError, ValueError):
            index = float("nan")
        if isinstance(layer, bool) or not index.is_integer() or not 0 <= index < count:  # NaN fails too
            raise ValueError(f"layer {str(layer)[:40]!r} is not one of this generation's {count} attention layers: "
                             "pick one from the list")
        return int(index)

    def layer_names(self, gen: Generation, step: int = 0) -> list[str]:
        return [layer_label(r) for r in self.records(gen, step)]

    def mean_attention_maps(self, gen: Generation, image: int, pixel: tuple[int, int],
                            on_step: Callable[[int, int, torch.Tensor], None] | None = None) -> Image.Image:
        """Every layer's attention of `pixel`, averaged over all denoising steps (one UNet call per step, the whole
        batch with its guidance: refused over the work budget before any work). on_step(i, total, the image in
        [0, 1]) after each step; raising from it stops the work."""
        image = _check_int("image", image, 0, gen.images.shape[0] - 1)
        S = gen.images.shape[-1]
        y, x = (_check_int("pixel y", pixel[0], 0, S - 1), _check_int("pixel x", pixel[1], 0, S - 1))
        unet, _ = self.model(gen.model)
        self.check_work(unet, gen.images.shape[0], gen.num_steps, gen.guidance)
        sums: dict[str, torch.Tensor] = {}
        for step in range(gen.num_steps):
            for rec in self.records(gen, step):
                H, W = rec.size
                w = rec.weights((y * H // S, x * W // S))[image]  # (h, H, W)
                sums[layer_label(rec)] = sums.get(layer_label(rec), 0) + w / gen.num_steps
            if on_step is not None:
                on_step(step, gen.num_steps, gen.images[image : image + 1])
        return maps_panel(gen.images[image], list(sums.items()), (y, x))

    def head_table(self, gen: Generation, image: int, timesteps=(800, 400, 100, 20),
                   on_step: Callable[[int, int, torch.Tensor], None] | None = None) -> tuple[list[LayerStats], Image.Image]:
        """`attention_stats` of one generated image (its class, heads included) and the charts. Its UNet calls (per
        noise level: one plain, then one per layer and per head switched off) are refused over the work budget
        before any work; on_step(i, total, the image in [0, 1]) after each call, and raising from it stops the work."""
        image = _check_int("image", image, 0, gen.images.shape[0] - 1)
        unet, train_sched = self.model(gen.model)
        calls = len(timesteps) * _stats_calls_per_timestep(unet)
        self.check_work(unet, 1, calls)
        labels = None if gen.labels is None else gen.labels[image : image + 1]
        x0 = unit_to_model(gen.images[image : image + 1])  # (1, C, H, W)
        shown = gen.images[image : image + 1]
        with _each_call(unet, None if on_step is None else (lambda i: on_step(i, calls, shown))):
            rows = attention_stats(unet, train_sched, x0, labels, timesteps)
        return rows, stats_chart(rows)

    def ablate(self, gen: Generation, layers: list[str], heads: list[int] | None = None, on_step=None) -> Generation:
        """The same seed and settings sampled again with `layers` (or their `heads`) switched to identity."""
        if gen.replay is None:
            raise ValueError("switching layers off samples the same seed again: generate images first (an edit has no seed to repeat)")
        if not layers:
            raise ValueError("choose at least one attention layer to switch off")
        unet, _ = self.model(gen.model)
        with identity_attention(unet, layers, heads):
            return self.generate(gen.model, **gen.replay, on_step=on_step)

    def four_stages(
        self, gen: Generation, image: int, step: int, pixel: tuple[int, int], layer: int, head: int
    ) -> tuple[Image.Image, Stages]:
        """Scores before softmax and weights after, for one pixel, layer and head, as a picture and as numbers."""
        recs = self.records(gen, step)
        rec = recs[self.check_layer(gen, layer)]
        head = _check_int("head", head, 0, rec.num_heads - 1)
        S = gen.images.shape[-1]
        H, W = rec.size
        yq, xq = pixel[0] * H // S, pixel[1] * W // S
        scores = rec.scores((yq, xq))[image, head]  # (H, W), stage (2)
        weights = rec.weights((yq, xq))[image, head]  # (H, W), stage (3)
        panel = stages_panel(gen.images[image], scores, weights, (pixel[0], pixel[1]))
        top = torch.topk(weights.flatten(), k=min(5, weights.numel()))
        return panel, Stages(
            layer=layer_label(rec), head=head, query=(yq, xq), grid=(H, W), head_dim=rec.q.shape[-1], step=step,
            timestep=gen.timesteps[step], score_range=(float(scores.min()), float(scores.max())),
            weight_sum=float(weights.sum()),
            top=[((int(i) // W, int(i) % W), float(scores.flatten()[i]), float(w)) for w, i in zip(top.values, top.indices)],
        )


def _stats_calls_per_timestep(unet) -> int:
    """UNet calls attention_stats makes per noise level: the plain call, then each layer switched off, then each
    head of a layer with several heads."""
    layers = [m for m in unet.modules() if isinstance(m, MultiHeadSelfAttention)]
    return 1 + sum(1 + (m.num_heads if m.num_heads > 1 else 0) for m in layers)


@contextlib.contextmanager
def _each_call(unet, after: Callable[[int], None] | None):
    """after(i) once the i-th UNet call (0-based) made by this thread inside the context has returned; an exception
    it raises ends the caller's work. Calls from other threads (other sessions) are not counted."""
    if after is None:
        yield
        return
    thread, count = threading.get_ident(), [0]

    def hook(module, args, output) -> None:
        if threading.get_ident() == thread:
            count[0] += 1
            after(count[0] - 1)

    handle = unet.register_forward_hook(hook)
    try:
        yield
    finally:
        handle.remove()


MAX_PROMPT_CHARS = 1000  # a prompt longer than this is refused (the tokenizer keeps its first max_length words anyway)


def _check_prompt(name: str, value) -> str | None:
    """A prompt from the page: text of at most MAX_PROMPT_CHARS; None or blank: no prompt."""
    if value is None:
        return None
    if not isinstance(value, str) or len(value) > MAX_PROMPT_CHARS:
        raise ValueError(f"the {name} must be text of at most {MAX_PROMPT_CHARS} characters, got "
                         f"{type(value).__name__} of length {len(str(value))}")
    return value.strip() or None


def _text_fields(plan: Plan) -> dict:
    """A Generation's text fields from its plan: the encoded prompts of the whole batch, the prompt, its words."""
    if plan.text is None:
        return {}
    prompt = plan.prompts[0] if plan.prompts else ""
    return dict(text=plan.text_condition(range(plan.num_images)), prompt=prompt,
                words=tuple(plan.text[0].tokens(prompt)))


def _check_scales(guidance_scale, pag_scale, guide_scale) -> dict:
    """The page's guidance sliders as SampleRequest fields, each within the page's limits."""
    values = {}
    for name, value in (("guidance_scale", guidance_scale), ("pag_scale", pag_scale), ("guide_scale", guide_scale)):
        try:
            values[name] = float(value)
        except (TypeError, ValueError):
            values[name] = float("nan")
        lo, hi = LIMITS[name]
        if not lo <= values[name] <= hi:  # NaN fails too
            label = {"guidance_scale": "guidance"}.get(name, name.replace("_", " "))  # as the page's sliders say
            raise ValueError(f"{label} must be a number in {lo:g}..{hi:g}, got {value!r}")
    return values


def _restore_request(operation: str, image: Image.Image | None, steps, seed, sigma, strength, add_noise) -> tuple:
    """The Edit tab's form, checked before any work: (operation kind, method, steps, seed)."""
    if operation not in RESTORE_OPERATIONS:
        raise ValueError(f"operation must be one of {', '.join(RESTORE_OPERATIONS)}, got {str(operation)[:40]!r}")
    if image is None:
        raise ValueError("upload an image first")
    if image.width * image.height > MAX_PIXELS:
        raise ValueError(f"the image is {image.width}x{image.height}: at most {MAX_PIXELS // 1_000_000} megapixels")
    steps = _check_int("steps", steps, *LIMITS["steps"])
    seed = _check_int("seed", seed, *LIMITS["seed"])
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

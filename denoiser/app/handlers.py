"""The web app's event handlers: each turns what a page sends into the engine's call and its answer into
what the page shows (images, galleries, sliders, Markdown). The layout that binds them to components is
denoiser/app/layout.py; the work is the engine's (denoiser/app/engine.py); long jobs run through
denoiser/app/streaming.py.
"""

from __future__ import annotations

import html
import logging
import os
import re
import tempfile
import time
from pathlib import Path

import gradio as gr
import torch
from PIL import Image, ImageDraw

from denoiser.app.budget import plan_work
from denoiser.app.engine import RESTORE_OPERATIONS, SCHEDULERS, Engine, Stages
from denoiser.app.kept import recall, remember
from denoiser.app.limits import LIMITS, check_int
from denoiser.app.streaming import friendly, not_started, relay, stream, user_error
from denoiser.app.words import (
    unread_note,
    word_choices,
    word_label,
    word_maps_label,
    word_maps_panel,
    word_weights_chart,
    word_weights_label,
    words_label,
)
from denoiser.image_io import read_settings, save_with_settings, to_pil
from denoiser.request import BUILT_IN

__all__ = ["Handlers", "click_to_pixel", "enlarge", "stages_text", "guidance_info", "HEAD_COLUMNS", "NO_CLASS", "MODELS_OWN",
           "N_VIEWS", "PROMPTS", "result_files", "escape", "few_steps_note"]

log = logging.getLogger("denoiser.app")
DISPLAY = 256  # pixels of the clickable image; clicks are mapped back to the model's grid
CLEARED_VIEWS = (None, None, None, "")  # pixel, maps, stages, stage text after a new generation
N_VIEWS = 6 + len(CLEARED_VIEWS) + 4  # what generation_views sets: the generation, its sliders and views, its words' views
# example prompts a text model's Sample tab offers to click (tried on weights/emoji with guidance 3: each gives
# recognisable pictures)
PROMPTS = ("red apple", "grinning face", "red heart", "pizza", "rocket", "cat", "sun", "ghost")
NO_CLASS = "(any)"
MODELS_OWN = "(the model's)"  # an advanced setting left to the model folder (its scheduler config, sampling.json)
# the Sample tab's form as a result's PNG carries it (layout._wire orders the form's controls the same way), and the
# values of settings a result written before them lacks
SETTINGS_FORM = {"model": None, "scheduler": None, "steps": None, "seed": None, "num_images": None, "class": None,
                 "guidance_scale": None, "pag_scale": None, "guide_scale": None, "timestep_spacing": MODELS_OWN,
                 "eta": 0.0, "guidance_interval": "", "pag_layers": "", "prompt": "", "negative_prompt": ""}
STOP_SETTLE_S = 0.5  # after Stop, the status line is written this long after the cancel
FEW_STEPS = 10  # sampling with fewer steps than this leaves visible noise (DDIM on the shipped models)
NO_GENERATION = "generate images first (Sample tab), or run the Edit tab: this view is of a generation"
RUNNING = ("denoising", "averaging", "measuring", *RESTORE_OPERATIONS)  # the status line's first word while a job runs (streaming.progress_text)
# after Stop, what the jobs without a preview leave shown (Attention's "average the maps", Heads' statistics)
STOPPED_SHOWS = {"averaging": "nothing was averaged; the maps shown are of the step chosen",
                 "measuring": "nothing was measured; the charts and table shown are from before, if any"}




def guidance_info(interval=None, prompt: bool = False) -> str:
    """The classifier-free guidance slider's note (for a text model's prompt with `prompt`); names the steps a model's
    sampling.json limits guidance to."""
    what = "prompt" if prompt else "class"
    text = f"classifier-free guidance: 2-3 makes the {what} clearer, 1 = off, needs a {what}"
    if interval:
        text += f"; this model guides steps t = {interval[0]:g}..{interval[1]:g} only (its measured interval)"
    return text


def result_files(images: torch.Tensor, settings: dict) -> list[str]:
    """Each image as a PNG named after and carrying its settings (denoiser.image_io.save_with_settings), in a folder
    of its own under the app's temp folder: downloads say how they were made, "use these settings" reads them back."""
    folder = tempfile.mkdtemp(prefix="results-", dir=os.environ.get("GRADIO_TEMP_DIR"))
    files = []
    for i in range(images.shape[0]):
        each = {**settings, "index": i, "count": images.shape[0]}
        path = save_with_settings(to_pil(images[i : i + 1], nrow=1, padding=0), folder, each)
        files.append(str(path))  # no caption over the picture: the file's name says it on download
    return files


def escape(text: str) -> str:
    """A person's text (a prompt) shown in Markdown as itself: no HTML, no emphasis, no links."""
    return re.sub(r"([\\`*_{}\[\]()#+!|~-])", r"\\\1", html.escape(text[:200], quote=False))


def few_steps_note(steps: int) -> str:
    """A warning for settings that give noise rather than pictures."""
    if steps >= FEW_STEPS:
        return ""
    return f" · **only {steps} step(s): the images are still mostly noise; use {FEW_STEPS} or more**"


def _display(gen, image: int, pixel: tuple[int, int] | None) -> Image.Image:
    img = to_pil(gen.images[image : image + 1], nrow=1, padding=0).resize((DISPLAY, DISPLAY), Image.Resampling.NEAREST)
    if pixel is not None:
        S = gen.images.shape[-1]
        cell = DISPLAY / S
        y, x = pixel
        ImageDraw.Draw(img).rectangle([x * cell, y * cell, (x + 1) * cell - 1, (y + 1) * cell - 1], outline=(0, 255, 255), width=2)
    return img


def click_to_pixel(index: tuple[int, int], sample_size: int, display: int = DISPLAY) -> tuple[int, int]:
    """Gradio reports clicks as (x, y) in the displayed image's own pixels: map them to (y, x) of the model grid."""
    x, y = index
    return min(sample_size - 1, int(y) * sample_size // display), min(sample_size - 1, int(x) * sample_size // display)


def enlarge(img: Image.Image, target: int = DISPLAY) -> Image.Image:
    """Scale a small preview up by a whole factor, nearest-neighbour: pixels stay sharp squares."""
    factor = max(1, target // max(img.width, img.height))
    return img.resize((img.width * factor, img.height * factor), Image.Resampling.NEAREST) if factor > 1 else img


def _index_slider(count: int, value: int) -> dict:
    """An index slider over 0..count-1, shown only when there is something to choose (a single image or step
    hides it: Gradio refuses minimum == maximum anyway, so it keeps maximum 1 at value 0)."""
    return gr.update(maximum=max(1, count - 1), value=value, interactive=count > 1, visible=count > 1)


HEAD_COLUMNS = ["layer", "head", "grid", "distance (px)", "entropy / log N", "self-weight", "output change"]


def _head_rows(rows) -> list[list]:
    """attention_stats rows -> one table row per (layer, head), averaged over the noise levels."""
    groups: dict[tuple[str, int], list] = {}
    for r in rows:
        groups.setdefault((r.layer, r.head), []).append(r)
    table = []
    for (layer, head), rs in groups.items():
        n = len(rs)
        table.append([layer, head, f"{rs[0].resolution}x{rs[0].resolution}",
                      round(sum(r.mean_distance for r in rs) / n, 2), round(sum(r.entropy / r.max_entropy for r in rs) / n, 3),
                      round(sum(r.self_weight for r in rs) / n, 3), round(sum(r.output_change for r in rs) / n, 4)])
    return table


def _generation(gen):
    """The session's generation, or the one refusal every view of it gives before there is one (NO_GENERATION)."""
    if gen is None:
        raise ValueError(NO_GENERATION)
    return gen


def _parse_heads(text) -> list[int] | None:
    """'all' (or empty) -> None; '0, 2' -> [0, 2]."""
    text = str(text or "").strip().lower()
    if text in ("", "all"):
        return None
    try:
        return [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ValueError(f"heads must be 'all' or comma-separated numbers such as 0,2; got {text[:40]!r}") from None


def stages_text(s: Stages) -> str:
    """The four stages of one pixel, layer and head in words, with its most attended pixels."""
    (yq, xq), (H, W) = s.query, s.grid
    rows = "\n".join(f"| ({y}, {x}) | {score:.3f} | {weight:.4f} |" for (y, x), score, weight in s.top)
    return (
        f"**{s.layer}, head {s.head}** — query pixel ({yq}, {xq}) of the {H}x{W} grid, "
        f"d = {s.head_dim}, step {s.step} (t = {s.timestep})\n\n"
        f"(1) q, k, v = projections of the {H * W} pixel tokens · (2) scores = q·kᵀ/√d: "
        f"min {s.score_range[0]:.3f}, max {s.score_range[1]:.3f} · (3) softmax: weights sum to "
        f"{s.weight_sum:.6f} · (4) output = weights · v\n\n"
        f"| attended pixel (y, x) | score | weight |\n|---|---|---|\n{rows}"
    )


class Handlers:
    """Every event handler of the page, bound to one engine (and so to one set of models)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def loads(self, model: str) -> bool:
        """Whether a model folder loads (the page offers broken folders in the model list, which says why)."""
        try:
            self.engine.model(model)
        except (ValueError, OSError):
            return False
        return True

    def _class_names(self, model) -> list[str]:
        try:
            return self.engine.classes(model) if model else []
        except ValueError:
            return []

    def class_choices(self, model, current=None):
        """The Edit tab's class selector for `model`: the class shown stays when the model has it, else "(any)"."""
        names = self._class_names(model)
        value = current if current in names else NO_CLASS
        return gr.update(choices=[NO_CLASS] + names, value=value, visible=bool(names))

    def sample_class_choices(self, model, current=None):
        """The Sample tab's class selector for `model`: the class shown stays when the model has it, else its first
        class (a class-conditional model samples best with one, and guidance needs one)."""
        names = self._class_names(model)
        value = current if current in names else (names[0] if names else NO_CLASS)
        return gr.update(choices=[NO_CLASS] + names, value=value, visible=bool(names))

    def is_text(self, model) -> bool:
        """Whether `model` takes a prompt (False for a class model and for a folder that does not load)."""
        try:
            return bool(model) and self.engine.is_text(model)
        except (ValueError, OSError):
            return False

    def example_row(self, model: str, seed: int) -> list:
        """A "try these" row for `model`: everything the Sample tab sets, at the model's best (a class or, for a text
        model, a prompt; its sampling.json's guidance)."""
        names = self._class_names(model)
        d, has_guide = self.model_defaults(model)
        text = self.is_text(model)
        class_name = names[seed % len(names)] if names else NO_CLASS
        prompt = PROMPTS[seed % len(PROMPTS)] if text else ""
        guidance_scale = d.get("guidance_scale", 1.0) if names or text else 1.0
        sampler = self._own_sampler(model) or (BUILT_IN["scheduler"], BUILT_IN["steps"])
        return [model, *sampler, seed, 8, class_name, guidance_scale, d.get("pag_scale", 0.0),
                d.get("guide_scale", 1.0) if has_guide else 1.0, prompt]

    def _own_sampler(self, model) -> tuple[str, int] | None:
        """(scheduler, steps): the model folder's measured best, its sampler where the app can run it (SCHEDULERS),
        else the built-in one; None for a folder that does not load (the page says so when it is used)."""
        try:
            own = self.engine.defaults(model)
        except (ValueError, OSError):
            return None
        return (own.scheduler if own.scheduler in SCHEDULERS else BUILT_IN["scheduler"]), own.steps

    def sample_form(self, model, scheduler, steps, seed, num_images, class_name, guidance_scale, pag_scale, guide_scale,
                    timestep_spacing, eta, guidance_interval, pag_layers, prompt="", negative_prompt="") -> dict:
        """The Sample tab's form as the engine's arguments (Engine.generate, Engine.sample_plan): the class by name as
        its label, checked against the model's classes; the advanced settings (timestep spacing, eta, guidance
        interval "lo, hi", PAG layers "a,b") left at MODELS_OWN or empty as None, the model's own (its scheduler
        config, sampling.json). The prompts only for a text model (a class model's page hides and empties them)."""
        classes = self.engine.classes(model) if model else []
        text = self.is_text(model)
        if class_name not in (None, "", NO_CLASS) and class_name not in classes:
            raise ValueError(f"class {str(class_name)[:40]!r} is not one of this model's classes: {', '.join(classes) or 'none'}")
        # the page's boxes hold a number or nothing (an emptied box): each checked here, where the engine would take
        # steps None for the folder's own
        steps, seed = check_int("steps", steps, *LIMITS["steps"]), check_int("seed", seed, *LIMITS["seed"])
        num_images = check_int("number of images", num_images, *LIMITS["num_images"])
        return dict(scheduler=scheduler, steps=steps, seed=seed, num_images=num_images,
                    class_label=classes.index(class_name) if class_name in classes else None, eta=float(eta or 0),
                    guidance_scale=guidance_scale, pag_scale=pag_scale, guide_scale=guide_scale,
                    timestep_spacing=None if timestep_spacing in (None, "", MODELS_OWN) else timestep_spacing,
                    guidance_interval=guidance_interval, pag_layers=pag_layers,
                    prompt=(prompt or None) if text else None, negative_prompt=(negative_prompt or None) if text else None)

    def generate(self, model, scheduler, steps, seed, num_images, class_name, guidance_scale=1.0, pag_scale=0.0, guide_scale=1.0,
                 timestep_spacing=MODELS_OWN, eta=0.0, guidance_interval="", pag_layers="", prompt="", negative_prompt="",
                 progress=gr.Progress()):
        """The Sample tab's Generate (the form as sample_form reads it)."""
        try:  # the request checked before any work (the engine checks it again): a refusal is a message, not a failure
            form = self.sample_form(model, scheduler, steps, seed, num_images, class_name, guidance_scale, pag_scale,
                                    guide_scale, timestep_spacing, eta, guidance_interval, pag_layers, prompt, negative_prompt)
            plan_work(self.engine.sample_plan(model, **form)).check()
        except Exception as err:  # noqa: BLE001
            error = user_error(err)
            yield (*(gr.skip(),) * (N_VIEWS + 2), not_started(error.message))  # the page's status line says why...
            raise error from None  # ... and an API caller gets the error (the page shows it as a toast that stays)
        label = form["class_label"]

        def job(on_step):
            return self.engine.generate(model, **form, on_step=on_step)

        gen = yield from relay(stream(job, progress, "denoising"), N_VIEWS + 3, enlarge, status=True)
        settings = dict(model=model, seed=int(seed), scheduler=scheduler, steps=int(steps), num_images=int(num_images),
                        guidance_scale=float(guidance_scale), pag_scale=float(pag_scale), guide_scale=float(guide_scale),
                        **{"class": None if label is None else class_name})
        advanced = dict(timestep_spacing=timestep_spacing or MODELS_OWN, eta=float(eta or 0),
                        guidance_interval=guidance_interval or "", pag_layers=pag_layers or "",
                        prompt=form["prompt"] or "", negative_prompt=form["negative_prompt"] or "")
        settings.update({k: v for k, v in advanced.items() if v != SETTINGS_FORM[k]})  # only those changed
        gallery = result_files(gen.images, settings)
        of = f" of “{escape(gen.prompt)}”" if gen.prompt else ""
        cut = f" · **{escape(note)}**" if (note := unread_note(gen.words, gen.unread)) else ""
        yield (
            enlarge(to_pil(gen.images)), gallery, *self.generation_views(gen),
            f"done: {gen.images.shape[0]} image(s){of}, {gen.num_steps} steps" + cut + few_steps_note(gen.num_steps),
        )

    @staticmethod
    def keep_results(gallery, kept) -> tuple:
        """A finished run's results added to the ones kept in the browser (denoiser.app.kept); the earlier results
        shown are those before them (the gallery above already shows the new ones)."""
        earlier = [k for k in (kept or []) if isinstance(k, dict)]
        return (remember(gallery, kept), *Handlers.kept_results(earlier))

    @staticmethod
    def kept_results(kept) -> tuple:
        """The earlier-results gallery and its button: the kept results, shown once there are any."""
        files = recall(kept)
        return gr.update(value=files, visible=bool(files)), gr.update(visible=bool(files))

    @staticmethod
    def select_result(evt: gr.SelectData) -> int:
        return int(evt.index)

    def use_settings(self, gallery, selected) -> tuple:
        """The Sample tab's form refilled from the selected result's PNG (its settings; the first result when none
        is selected): SETTINGS_FORM's fields (the advanced ones too; the class among its model's choices), and a
        line saying so."""
        items = list(gallery or [])
        if not items:
            return (*(gr.skip(),) * len(SETTINGS_FORM), "generate first: the settings are read from a result")
        item = items[min(int(selected or 0), len(items) - 1)]
        path = Path(str(item[0] if isinstance(item, (list, tuple)) else item))  # (path, caption) or a path
        s = read_settings(path)
        if not s:
            return (*(gr.skip(),) * len(SETTINGS_FORM), "this result carries no settings")
        values = {k: s.get(k, default) for k, default in SETTINGS_FORM.items()}  # older results lack the advanced ones
        values["class"] = values["class"] or NO_CLASS
        updates = {k: gr.update(value=v) for k, v in values.items()}
        names = self._class_names(values["model"])  # "(any)" stays what it was: the result was made without a class
        updates["class"] = gr.update(choices=[NO_CLASS] + names, value=values["class"], visible=bool(names))
        updates["guidance_scale"] = gr.update(value=values["guidance_scale"], **self.guidance_label(values["model"]))
        text = self.is_text(values["model"])
        for key in ("prompt", "negative_prompt"):
            updates[key] = gr.update(value=values[key] or "", visible=text)
        return (*updates.values(), f"settings of {path.name} restored: press Generate")

    @staticmethod
    def stopped(status: str | None) -> str:
        time.sleep(STOP_SETTLE_S)  # the cancel reaches the page first: this line comes after its state
        return Handlers._stopped_text(status)

    @staticmethod
    def _stopped_text(status: str | None) -> str:
        """The status line after Stop: where the job stopped, and what the pictures shown are (a sampling job's
        preview is the step's predicted x₀; the Attention tab's averaging and the Heads tab's statistics have no
        preview: their maps or charts are from before)."""
        match = re.search(r"step (\d+) / (\d+)", status or "")
        if match is None or not str(status).startswith(tuple(RUNNING)):
            return status or ""  # nothing was running
        k, n = match.groups()
        shown = STOPPED_SHOWS.get(str(status).split(":")[0], "the preview is that step's predicted clean image (x₀), "
                                                              "not a result; the results shown are from the run before")
        return f"**stopped at step {k} / {n}**: {shown}"

    def generation_views(self, gen) -> tuple:
        """What a new generation sets on the page (after its pictures): the generation itself, the image and step
        sliders over it (its last step chosen), its first image to click, its layers and heads, and the attention
        views of the previous one cleared."""
        words = gr.update(choices=word_choices(gen.words_of(0), gen.weights_of(0)), value=None, visible=bool(gen.words),
                          label=words_label(gen.words, gen.unread))
        shown = gr.update(value=None, visible=bool(gen.words))
        heads = gr.update(visible=bool(gen.words))  # the word maps' "each head": as the person left it
        return (gen, _index_slider(gen.images.shape[0], 0), _index_slider(gen.num_steps, gen.num_steps - 1),
                _display(gen, 0, None), *self._layer_choices(gen), *CLEARED_VIEWS, words, shown, shown, heads)

    def _layer_choices(self, gen) -> tuple[dict, dict]:
        """A new generation's layer selector (its last step's layers, the first chosen) and head selector (the
        first layer's heads)."""
        records = self.engine.records(gen, gen.num_steps - 1)
        names = self.engine.layer_names(gen, gen.num_steps - 1)
        return (gr.update(choices=[(name, i) for i, name in enumerate(names)], value=0),
                gr.update(choices=list(range(records[0].num_heads)), value=0))

    @friendly
    def at_pixel(self, gen, image, step, y, x, layer, head):
        """The views of one pixel at one step: the clickable image marked, every layer's maps, the four stages."""
        _generation(gen)
        pixel = (y, x)
        try:
            maps = self.engine.attention_maps(gen, image, step, pixel)
            stages, numbers = self.engine.four_stages(gen, image, step, pixel, layer or 0, head or 0)
        except ValueError as err:
            raise user_error(err) from None
        y, x = int(y), int(x)
        return (y, x), y, x, _display(gen, int(image), (y, x)), maps, stages, stages_text(numbers)

    @friendly
    def click(self, gen, image, step, layer, head, evt: gr.SelectData):
        _generation(gen)
        y, x = click_to_pixel(evt.index, gen.images.shape[-1])
        return self.at_pixel(gen, image, step, y, x, layer, head)

    @friendly
    def refresh(self, gen, image, step, pixel, layer, head):
        """Every view at the current (image, step, pixel): the clickable image, the maps, the four stages."""
        if gen is None:
            return None, None, None, ""
        if pixel is None:
            return _display(gen, int(image), None), None, None, ""
        return self.at_pixel(gen, image, step, pixel[0], pixel[1], layer, head)[3:]

    @friendly
    def word_views(self, gen, image, step, pixel, word, heads=False):
        """A text model's cross-attention at (image, step): the chosen word's map, all layers together and in every
        cross-attention layer (heads: each head's too), and the clicked pixel's weights over the prompt's words;
        None where there is no word or pixel (or no prompt)."""
        if gen is None or not gen.words:
            return None, None
        try:
            weights_of = gen.weights_of(image)
            labels = [word_label(w, x) for w, x in zip(gen.words_of(image), weights_of)]
            maps = None
            if word is not None:
                panel = self.engine.word_maps(gen, image, step, word)
                maps = gr.update(value=word_maps_panel(gen.images[int(image)], panel, None if pixel is None else tuple(pixel),
                                                       heads=bool(heads)), label=word_maps_label(labels[int(word)]))
            weights = None
            if pixel is not None:
                weights = gr.update(value=word_weights_chart(self.engine.word_weights(gen, image, step, pixel), labels),
                                    label=word_weights_label(any(x != 1 for x in weights_of)))
        except ValueError as err:
            raise user_error(err) from None
        return maps, weights

    def mean_maps(self, gen, image, pixel, progress=gr.Progress()):
        """The clicked pixel's maps averaged over every step of the chain: long work (one UNet call per step), so a
        job like Generate (the one-job queue, the work budget, progress, Stop). Outputs: maps, status line."""
        try:
            _generation(gen)
            if pixel is None:
                raise ValueError("click a pixel of the image first: the maps are of that pixel")
        except Exception as err:  # noqa: BLE001
            error = user_error(err)
            yield gr.skip(), not_started(error.message)
            raise error from None

        def job(on_step):
            return self.engine.mean_attention_maps(gen, image, pixel, on_step=on_step)

        maps = yield from relay(stream(job, progress, "averaging"), 2, lambda preview: gr.skip(), status=True)
        yield maps, f"done: the maps of pixel (y {pixel[0]}, x {pixel[1]}) averaged over all {gen.num_steps} steps"
    def model_defaults(self, model):
        """(its sampling.json, whether it ships a guide) of the chosen model; none for a broken folder."""
        try:
            return self.engine.sampling_defaults(model) if model else ({}, False)
        except ValueError:
            return {}, False

    def budget_note(self, model, steps, num_images, class_name, guidance_scale=1.0, pag_scale=0.0, guide_scale=1.0,
                    scheduler=None, timestep_spacing=MODELS_OWN, guidance_interval="", pag_layers="", prompt="",
                    negative_prompt="") -> str:
        """The work Generate would do with this form against the server's budget, shown under the sliders before
        Generate: the plan Generate samples (the model folder's guidance interval and guide included) counted by the
        rule its refusal uses (denoiser.app.budget), so the note says "over" exactly when Generate refuses. Nothing for
        a form Generate refuses for another reason (it says why). scheduler and the advanced settings as Generate
        reads them (sample_form): left unset, the model's own."""
        try:
            form = self.sample_form(model, scheduler, steps, 0, num_images, class_name, guidance_scale, pag_scale,
                                    guide_scale, timestep_spacing, 0.0, guidance_interval, pag_layers, prompt, negative_prompt)
            work = plan_work(self.engine.sample_plan(model, **form))
        except (ValueError, TypeError, OSError):
            return ""
        if not work.over:
            return f"work: {work.units:,.0f} of {work.budget:,.0f} units"
        return (f"**over the work budget** ({work.units:,.0f} of {work.budget:,.0f} units): at most {work.max_steps} "
                f"steps with {work.num_images} images, or {work.max_images} images with {work.steps} steps")

    def model_form(self, model, current_class=None):
        """The Sample tab set to the chosen model's measured best (on load, and when a person picks a model): a class
        (sample_class_choices), its classifier-free scale (cfg_default), its folder's sampler and step count, and
        its sampling.json's attention guidance and autoguidance (that slider only where it ships a guide)."""
        class_update = self.sample_class_choices(model, current_class)
        if (sampler := self._own_sampler(model)) is None:  # a model that does not load: the page says so when used
            return (class_update, *(gr.skip(),) * 5)
        d, has_guide = self.model_defaults(model)
        scheduler, steps = sampler
        return (class_update, self.sample_cfg_default(model, class_update["value"]), gr.update(value=scheduler),
                gr.update(value=steps), gr.update(value=d.get("pag_scale", 0.0)),
                gr.update(value=d.get("guide_scale", 1.0) if has_guide else 1.0, visible=has_guide))

    def cfg_default(self, model, class_name):
        """The model's classifier-free scale once a class is chosen; 1 (off) for "(any)", which it needs. The
        slider's note names the steps the model guides when its sampling.json limits them. (The Edit tab's: a text
        model runs unconditioned until a prompt is typed, so there it starts at 1 and says so.)"""
        d = self.model_defaults(model)[0]
        if self.is_text(model):
            return gr.update(value=1.0, label="guidance (with a prompt)", info="a text model: without a prompt it runs "
                             "unconditioned, keep 1; a prompt typed (edit, inpaint) sets the model's scale")
        scale = d.get("guidance_scale", 1.0) if class_name not in (None, "", NO_CLASS) else 1.0
        return gr.update(value=scale, label="guidance (with a class)", info=guidance_info(d.get("guidance_interval")))

    def sample_cfg_default(self, model, class_name):
        """The Sample tab's guidance for the chosen model: a class model's as cfg_default; a text model's is its
        sampling.json's scale for a prompt (1 where it names none), on a slider that says it steers by the prompt."""
        if not self.is_text(model):
            return self.cfg_default(model, class_name)
        return gr.update(value=self.model_defaults(model)[0].get("guidance_scale", 1.0), **self.guidance_label(model))

    def guidance_label(self, model) -> dict:
        """The Sample tab's guidance slider's label and note for `model`: guidance with a prompt (a text model) or
        with a class, and the steps its sampling.json guides."""
        text, interval = self.is_text(model), self.model_defaults(model)[0].get("guidance_interval")
        return dict(label=f"guidance (with a {'prompt' if text else 'class'})", info=guidance_info(interval, prompt=text))

    def filled_form(self, model, class_name) -> tuple:
        """After a "try these" row filled the Sample form: its model's class choices (the row's class shown) and the
        guidance slider's label for its model (its value the row's)."""
        return self.sample_class_choices(model, class_name), gr.update(**self.guidance_label(model))

    def text_controls(self, model):
        """The Sample tab's prompt, negative prompt and example prompts: shown for a text model; hidden for a class model
        and kept for when a text model is picked again (what a class model samples takes no prompt: sample_form reads
        none for it, so its run and its PNGs have none)."""
        shown = self.is_text(model)
        return gr.update(visible=shown), gr.update(visible=shown), gr.update(visible=shown)

    def head_stats(self, gen, image, progress=gr.Progress()):
        """The Heads tab's statistics of one generated image: long work (a UNet call per noise level, layer and head),
        so a job like Generate. Outputs: chart, table, the layers to switch off, status line."""
        if gen is None:  # a hint, not an error: no "Error" badge over the chart and the layer list
            gr.Warning(NO_GENERATION)
            yield gr.skip(), gr.skip(), gr.skip(), NO_GENERATION
            return

        def job(on_step):
            return self.engine.head_table(gen, image, on_step=on_step)

        rows, chart = yield from relay(stream(job, progress, "measuring"), 4, lambda preview: gr.skip(), status=True)
        unprompted = " (a text model: measured without its prompt, unconditional)" if gen.words else ""
        yield (chart, _head_rows(rows), gr.update(choices=list(dict.fromkeys(r.layer for r in rows))),
               f"done: {len({r.layer for r in rows})} layers at {len({r.timestep for r in rows})} noise levels{unprompted}")

    def switch_off(self, gen, layers, heads, progress=gr.Progress()):
        """The Heads tab's switch: the same seed regenerated with the chosen layers or heads at identity attention.
        Before any generation, the hint Compute statistics gives (a warning and its line, not an error)."""
        if gen is None:
            gr.Warning(NO_GENERATION)
            yield gr.skip(), NO_GENERATION
            return
        try:
            head_ids = _parse_heads(heads)
        except Exception as err:  # noqa: BLE001
            raise user_error(err) from None

        def job(on_step):
            return self.engine.ablate(gen, list(layers or []), head_ids, on_step=on_step)

        off = yield from relay(stream(job, progress, "switched off"), 2, lambda preview: enlarge(preview))
        which = ", ".join(layers) + ("" if head_ids is None else f" (heads {', '.join(map(str, head_ids))})")
        yield (enlarge(to_pil(torch.cat([gen.images, off.images]), nrow=gen.images.shape[0]), target=768),
               f"Top row: as generated. Bottom row: the same seed with **{which}** switched to identity attention "
               f"(each pixel attends only to itself). Mean pixel change: {float((off.images - gen.images).abs().mean()):.4f}")

    @friendly
    def restage(self, gen, image, step, pixel, layer, head):
        """The four stages at the chosen layer and head; the head selector offers the chosen layer's heads (a
        head the layer lacks becomes head 0)."""
        if gen is None:
            return None, "", gr.skip()
        records = self.engine.records(gen, step)
        layer = self.engine.check_layer(gen, layer)
        heads = records[layer].num_heads
        head = int(head) if head is not None and 0 <= int(head) < heads else 0
        choices = gr.update(choices=list(range(heads)), value=head)
        if pixel is None:
            return None, "", choices
        stages, numbers = self.engine.four_stages(gen, image, step, pixel, layer, head)
        return stages, stages_text(numbers), choices

    def restage_head(self, gen, image, step, pixel, layer, head):
        """The four stages at another head of the chosen layer."""
        return self.restage(gen, image, step, pixel, layer, head)[:2]

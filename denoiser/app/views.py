"""The Attention tab's handlers: what a new generation sets on it, a clicked pixel's maps and four stages, a text
model's word maps, the maps averaged over the chain (the Heads tab is denoiser/app/heads_tab.py). A
mixin of denoiser.app.handlers.Handlers, which binds it to an engine; the drawing is denoiser/app/attention_views.py's.
"""

from __future__ import annotations

import functools

import gradio as gr
from PIL import Image, ImageDraw

from denoiser.app.engine import Stages
from denoiser.app.form_limits import check_int
from denoiser.app.streaming import friendly, not_started, relay, stream, user_error
from denoiser.app.words import (
    word_choices,
    word_label,
    word_maps_label,
    word_maps_panel,
    word_weights_chart,
    word_weights_label,
    words_label,
)
from denoiser.image_io import to_pil

__all__ = ["ViewHandlers", "click_to_pixel", "enlarge", "stages_text", "N_VIEWS", "NO_GENERATION"]

DISPLAY = 256  # pixels of the clickable image; clicks are mapped back to the model's grid
CLEARED_VIEWS = (None, None, None, "")  # pixel, maps, stages, stage text after a new generation
N_VIEWS = 6 + len(CLEARED_VIEWS) + 4  # what generation_views sets: the generation, its sliders and views, its words' views
NO_GENERATION = "generate images first (Sample tab), or run the Photo tab: this view is of a generation"


def _within(value, count: int) -> bool:
    """Whether a slider's `value` is a whole index in 0..count-1 (the engine's check, limits.check_int)."""
    try:
        check_int("index", value, 0, count - 1)
    except ValueError:
        return False
    return True


def of_this_generation(outputs: int):
    """For a view that follows a change of the page's sliders and selectors: an image or step out of the generation's
    range is the generation before's. A new generation sets the image and step sliders in the update that brings it,
    but the change event of one component of that update (the layer selector reset to 0) can read the step slider
    before its new value has landed (the long walk, seed 10 step 94: "step must be a whole number in 0..1, got 89"
    after a 2-step Generate). Such a view is left as it is (`outputs` skips): the step slider's own change event, with
    its new value, follows and draws it."""

    def wrap(handler):
        @functools.wraps(handler)
        def wrapped(self, gen, image, step, *args, **kwargs):
            if gen is not None and not (_within(image, gen.images.shape[0]) and _within(step, gen.num_steps)):
                return (gr.skip(),) * outputs
            return handler(self, gen, image, step, *args, **kwargs)

        return wrapped

    return wrap


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





def _generation(gen):
    """The session's generation, or the one refusal every view of it gives before there is one (NO_GENERATION)."""
    if gen is None:
        raise ValueError(NO_GENERATION)
    return gen


def stages_text(s: Stages) -> str:
    """The four stages of one pixel, layer and head in words, with its most attended pixels."""
    (yq, xq), (H, W) = s.query, s.grid
    rows = "\n".join(f"| ({y}, {x}) | {score:.3f} | {weight:.4f} |" for (y, x), score, weight in s.top)
    return (
        f"**{s.layer}, head {s.head}** — query pixel ({yq}, {xq}) of the {H}x{W} grid, "
        f"d = {s.head_dim}, step {s.step} (t = {s.timestep})\n\n"
        f"(1) q, k, v (query, key, value) = projections of the {H * W} pixel tokens · (2) scores = q·kᵀ/√d (each "
        f"query against every key, divided by the square root of the head size d): "
        f"min {s.score_range[0]:.3f}, max {s.score_range[1]:.3f} · (3) softmax: weights sum to "
        f"{s.weight_sum:.6f} · (4) output = weights · v\n\n"
        f"| attended pixel (y, x) | score | weight |\n|---|---|---|\n{rows}"
    )


class ViewHandlers:
    """The Attention and Heads tabs' handlers; `self.engine` is the Handlers'."""

    def generation_views(self, gen) -> tuple:
        """What a new generation sets on the page (after its pictures): the generation itself, the image and step
        sliders over it (its last step chosen), its first image to click, its layers and heads, and the attention
        views of the previous one cleared."""
        words = gr.update(choices=word_choices(gen.words_of(0), gen.weights_of(0)), value=None, visible=bool(gen.words),
                          label=words_label(gen.words, gen.unread, gen.unseen))
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
        except ValueError as err:
            raise user_error(err) from None
        try:
            stages, numbers = self.engine.four_stages(gen, image, step, pixel, layer or 0, head or 0)
            text = stages_text(numbers)
        except ValueError as err:  # a layer typed that is none: said on the stages' line; the pixel's views still show
            stages, text = None, f"**Not shown:** {user_error(err).message}"
        y, x = int(y), int(x)
        return (y, x), y, x, _display(gen, int(image), (y, x)), maps, stages, text

    @friendly
    def click(self, gen, image, step, layer, head, evt: gr.SelectData):
        _generation(gen)
        y, x = click_to_pixel(evt.index, gen.images.shape[-1])
        return self.at_pixel(gen, image, step, y, x, layer, head)

    @friendly
    @of_this_generation(4)
    def refresh(self, gen, image, step, pixel, layer, head):
        """Every view at the current (image, step, pixel): the clickable image, the maps, the four stages."""
        if gen is None:
            return None, None, None, ""
        if pixel is None:
            return _display(gen, int(image), None), None, None, ""
        return self.at_pixel(gen, image, step, pixel[0], pixel[1], layer, head)[3:]

    @friendly
    @of_this_generation(2)
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

    def mean_maps(self, gen, image, pixel, progress=gr.Progress(), request: gr.Request = None):
        """The clicked pixel's maps averaged over every step of the chain: long work (one UNet call per step), so a
        job like Generate (the one-job queue, the work budget, progress, Stop). Outputs: maps, status line."""
        try:
            _generation(gen)
            if pixel is None:
                raise ValueError("click a pixel of the image first: the maps are of that pixel")
        except Exception as err:  # noqa: BLE001
            error = user_error(err)
            self.jobs.finished(request, "mean-status")
            yield gr.skip(), not_started(error.message)
            raise error from None

        def job(on_step):
            return self.engine.mean_attention_maps(gen, image, pixel, on_step=on_step)

        with self.jobs.running(request, "mean-status"):
            maps = yield from relay(stream(job, progress, "averaging"), 2, lambda preview: gr.skip(), status=True)
        self.jobs.finished(request, "mean-status")
        yield maps, f"done: the maps of pixel (y {pixel[0]}, x {pixel[1]}) averaged over all {gen.num_steps} steps"

    @friendly
    @of_this_generation(3)
    def restage(self, gen, image, step, pixel, layer, head):
        """The four stages at the chosen layer and head; the head selector offers the chosen layer's heads (a
        head the layer lacks becomes head 0)."""
        if gen is None:
            return None, "", gr.skip()
        records = self.engine.records(gen, step)
        try:
            layer = self.engine.check_layer(gen, layer)
        except ValueError as err:  # a layer typed that is none: said in words, the head list kept, no stale stages
            message = user_error(err).message
            gr.Warning(message)
            return None, f"**Not shown:** {message}", gr.skip()
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

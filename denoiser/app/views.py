"""What a generation shows on the page, pieces the tabs share: the image to click (`clickable_image`), the image
and step sliders, the four stages in words, a click mapped to the model's grid, an enlarged preview, the one refusal
before there is a generation (`require_generation`), and the guard that leaves a view alone when its sliders are of
the generation before (`of_this_generation`). The Attention tab itself is denoiser/app/attention_tab.py (a new
generation's views: `AttentionTab.show`), the Heads tab denoiser/app/heads_tab.py.
"""

from __future__ import annotations

import functools

import gradio as gr
from PIL import Image, ImageDraw

from denoiser.app.engine import Stages
from denoiser.app.form_limits import check_int
from denoiser.image_io import to_pil

__all__ = ["of_this_generation", "clickable_image", "click_to_pixel", "enlarge", "index_slider", "require_generation",
           "stages_text", "NO_GENERATION"]

DISPLAY = 256  # pixels of the clickable image; clicks are mapped back to the model's grid
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


def clickable_image(gen, image: int, pixel: tuple[int, int] | None) -> Image.Image:
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


def index_slider(count: int, value: int) -> dict:
    """An index slider over 0..count-1, shown only when there is something to choose (a single image or step
    hides it: Gradio refuses minimum == maximum anyway, so it keeps maximum 1 at value 0)."""
    return gr.update(maximum=max(1, count - 1), value=value, interactive=count > 1, visible=count > 1)



def require_generation(gen):
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

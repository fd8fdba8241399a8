"""The Edit tab: your own photo denoised (at its own size, in tiles), denoised by sampling, edited or inpainted.
Its components (edit_tab), its handlers (EditHandlers) and which handler serves which of its events (wire_edit);
the page around it is denoiser/app/layout.py, the work the engine's (denoiser/app/engine.py).
"""

from __future__ import annotations

import html
import logging
from pathlib import Path
from types import SimpleNamespace

import gradio as gr
from PIL import Image

from denoiser.app.controls import keep, run_controls
from denoiser.app.engine import LIMITS, RESTORE_OPERATIONS, Restored
from denoiser.app.handlers import NO_CLASS, Handlers, enlarge, guidance_info
from denoiser.app.streaming import relay, stream, user_error
from denoiser.image_io import open_image, to_pil

__all__ = ["edit_tab", "wire_edit", "EditHandlers", "photo_preview", "restored_text", "EXAMPLES"]

log = logging.getLogger("denoiser.app")
# the Edit tab paints on a copy of the photo at most this many pixels a side: the browser re-encodes what the
# editor holds as PNG on every run (a 2400x1800 JPEG of 600 KB became 8.4 MB), a copy this size stays ~1 MB
EDIT_PREVIEW = 512
# pictures for the Edit tab's examples, drawn for this project (MIT, like the code); shipped in the package
EXAMPLES = Path(__file__).resolve().parent / "examples"


def _editor_layers(value) -> tuple[Image.Image | None, Image.Image | None]:
    """The ImageEditor's uploaded image and the painted mask (opaque brush pixels: white), or None."""
    if not value or value.get("background") is None:
        return None, None
    image = value["background"]
    if all(band == (255, 255) for band in image.convert("RGB").getextrema()):  # the editor's blank white canvas
        raise ValueError("upload a photo first (or click one of the pictures under the Run button)")
    painted = [layer for layer in value.get("layers") or [] if layer is not None]
    if not painted:
        return image, None
    alpha = Image.new("L", painted[0].size, 0)
    for layer in painted:
        alpha = Image.composite(Image.new("L", layer.size, 255), alpha, layer.convert("RGBA").getchannel("A"))
    return image, alpha


def _edit_input(editor, photo: str | None, shown: str | None, operation: str):
    """(image, mask) to process: the uploaded file's picture (as the editor shows it, `photo_preview`) and the mask
    painted on it; without an upload (an API call), the editor's own picture."""
    if not photo:
        return _editor_layers(editor)
    image, _ = photo_preview(photo)
    if shown != photo:  # the editor still holds the previous upload: its paint belongs to that one
        if operation == "inpaint":
            raise ValueError("the new photo is still loading into the editor: paint the area to regenerate on it, then Run")
        return image, None
    return image, _editor_layers(editor)[1]


def _centre_square(image: Image.Image) -> Image.Image:
    """The centre square of a picture: the part the model's size keeps (denoiser.image_io.image_to_model)."""
    side = min(image.size)
    left, top = (image.width - side) // 2, (image.height - side) // 2
    return image.crop((left, top, left + side, top + side))


def photo_preview(path: str | None) -> tuple[Image.Image | None, str]:
    """An uploaded photo file -> (an RGB copy at most EDIT_PREVIEW pixels a side to paint on, a line saying so).
    Decoded with bounded memory (denoiser.image_io); a file that is no image raises a sentence without a path."""
    if path is None:
        return None, ""
    img = open_image(path, min_long_side=EDIT_PREVIEW, what="the upload")  # a JPEG decodes at a reduced scale
    w, h = img.info["source_size"]
    img.thumbnail((EDIT_PREVIEW, EDIT_PREVIEW), Image.Resampling.LANCZOS)
    return img, (f"your photo: {w}x{h}, shown at {img.width}x{img.height}. Denoise works on this copy at its size; "
                 "the other operations on its centre square at the model's size. To inpaint, paint over what to regenerate.")


def restored_text(r: Restored) -> str:
    """What the Edit tab did, in one paragraph, pointing to where to look next."""
    w, h = r.input_size
    text = f"**{r.operation}**: {w}x{h} input, resized and centre-cropped to {r.size}x{r.size}; {r.steps} step(s)"
    if r.psnr is not None:
        text += f". PSNR against your image: noisy {r.psnr[0]:.2f} dB, result {r.psnr[1]:.2f} dB"
    return text + ". Open the **Attention** tab to see where the U-Net looked."


class EditHandlers:
    """The Edit tab's event handlers, beside the page's (`Handlers`, whose engine and generation views they share)."""

    def __init__(self, h: Handlers) -> None:
        self.h, self.engine = h, h.engine

    def run_edit(self, model, class_name, guidance_scale, editor, operation, sigma, strength, add_noise, steps, seed,
                 pag_scale=0.0, photo=None, shown=None, progress=gr.Progress()):
        """photo: the uploaded file; shown: the upload the editor holds (it may still hold the previous one while
        a new upload loads): the pixels processed and "your image" both come from the upload."""
        try:
            classes = self.engine.classes(model) if model else []
            label = classes.index(class_name) if class_name in classes else None
            image, mask = _edit_input(editor, photo, shown, operation)
        except Exception as err:  # noqa: BLE001
            raise user_error(err) from None
        if operation == "denoise" and not float(add_noise or 0):  # at the picture's own size, in tiles
            return (yield from self._denoise_in_tiles(model, image, sigma, progress))

        def job(on_step):
            return self.engine.restore(model, operation, image, mask, float(sigma or 0), float(strength or 0),
                                       float(add_noise or 0), steps, seed, label, guidance_scale, on_step=on_step,
                                       pag_scale=pag_scale)

        square = _centre_square(image)  # what the model sees: "your image" in the result's framing
        gen, noisy, done = yield from relay(stream(job, progress, operation), 13,
                                            lambda preview: [(square, "your image"), (enlarge(preview), "predicted clean image (x₀)")],
                                            status=True)
        text = restored_text(done)
        shown = [(square, "your image")] + ([(noisy, "noisy")] if noisy is not None else [])
        shown.append((to_pil(gen.images, nrow=1, padding=0), "result"))
        yield (
            shown, text, *self.h.generation_views(gen), f"done: {operation} with {model}, {gen.num_steps} step(s)",
        )

    def _denoise_in_tiles(self, model, image: Image.Image, sigma, progress):
        """One-step denoise of the picture at its own size (overlapping tiles at the model's size): before and after
        in the same framing. The attention views keep the previous generation (tiles are no generation)."""

        def job(on_step):
            return self.engine.denoise_tiles(model, image, float(sigma or 0) or None, on_step=on_step)

        result = yield from relay(stream(job, progress, "denoise (tiles)"), 13, lambda _: [(image, "your image")], status=True)
        size = self.engine.model(model)[0].config.sample_size
        text = (f"**denoise**: {image.width}x{image.height} input, denoised at its own size in overlapping {size}x{size} "
                "tiles (the model's size). The Attention tab opens runs at the model's size: denoise (sampled), edit, "
                "inpaint, or noise added first.")
        yield ([(image, "your image"), (result, "result")], text, *(gr.skip(),) * 10,
               f"done: denoise with {model}, at {image.width}x{image.height}")

    def load_photo(self, path):
        """The photo into the editor, and which upload it shows; a file that cannot be used says why under the
        upload box (no path)."""
        try:
            image, text = photo_preview(path)
        except (ValueError, FileNotFoundError) as err:
            log.info("upload refused: %s", err)
            return None, f"**This file cannot be used:** {html.escape(str(err), quote=False)}", path
        return ({"background": image, "layers": [], "composite": image} if image is not None else None), text, path


def edit_tab(c: SimpleNamespace, models: list[str], default: str | None) -> None:
    """The Edit tab's components, onto `c` (layout.keep)."""
    with gr.Tab("Edit"):
        with gr.Row():
            with gr.Column(scale=1):
                gr.Markdown("Denoise keeps your photo's size (a copy at most 512 pixels a side); denoise (sampled), edit "
                            "and inpaint work on its centre square at the model's size.", elem_id="edit-sizes")
                photo = gr.File(label="your photo: JPEG, PNG or WebP, up to 50 megapixels and 25 MB",
                                file_types=["image"], type="filepath", elem_id="photo", height=110)
                photo_text = gr.Markdown(elem_id="photo-text")
                # the editor gets a small copy of the photo (photo_preview): painting needs no more, and the
                # browser sends the editor's content back as PNG on every run
                editor = gr.ImageEditor(type="pil", sources=(), elem_id="editor", height=320,
                                        label="inpaint mask",  # short: the editor's toolbar covers long labels
                                        brush=gr.Brush(colors=["#ff00ff"], color_mode="fixed"))
                gr.Examples([[str(f)] for f in sorted(EXAMPLES.glob("*.png"))], [photo], label="try a picture")
            # Run, Stop, the progress and the results together, beside the photo (on a phone: under it)
            with gr.Column(scale=1):
                edit_run, edit_stop, edit_status = run_controls("Run", "edit-run", "edit-stop", "edit-status")
                edit_result = gr.Gallery(label="before and after", format="png", columns=3, elem_id="edit-result",
                                         object_fit="contain", height="auto")
                edit_text = gr.Markdown(elem_id="edit-text")
            with gr.Column(scale=1):
                operation = gr.Radio(list(RESTORE_OPERATIONS), value="denoise", label="operation")
                # the Edit tab's own model, class and guidance: what runs is what this tab shows
                edit_model = gr.Dropdown(models, value=default, label="model", elem_id="edit-model")
                edit_class = gr.Dropdown([NO_CLASS], value=NO_CLASS, label="class (sampled denoise, edit, inpaint)",
                                         visible=False, allow_custom_value=True, elem_id="edit-class")
                edit_guidance = gr.Slider(*LIMITS["guidance_scale"], value=1.0, step=0.5, label="guidance (with a class)",
                                          elem_id="edit-cfg", info=guidance_info())
                # one slider per meaning, the one the operation uses shown
                sigma = gr.Slider(0, 1, value=0.0, step=0.01, label="noise σ of your image (0 = estimate)",
                                  elem_id="sigma", info="denoise: how noisy your picture is, on the 0..1 pixel scale")
                strength = gr.Slider(0.01, 1, value=0.3, step=0.01, label="edit strength", elem_id="strength", visible=False,
                                     info="0.1-0.3 keeps your picture and redraws its details; from about 0.5 the model "
                                          "replaces it with a picture of its own")
                add_noise = gr.Slider(0, 0.5, value=0.0, step=0.01, label="add noise first (noise level σ, 0 = off)", info="the round trip with PSNR: noise is added to the centre square at the model's size (e.g. 32x32), then removed")
                edit_steps = gr.Slider(*LIMITS["steps"], value=50, step=1, label="steps (sampled denoise, edit, inpaint)")
                edit_seed = gr.Number(value=0, precision=0, label="seed", minimum=LIMITS["seed"][0], maximum=LIMITS["seed"][1])
                edit_pag = gr.Slider(*LIMITS["pag_scale"], value=0.0, step=0.25, label="attention guidance (PAG)",
                                     info="for sampled denoise, edit and inpaint; 0 = off")
    keep(c, locals())


def wire_edit(app: gr.Blocks, h: Handlers, c: SimpleNamespace, cleared: list) -> None:
    """Which handler serves which of the Edit tab's events; `cleared`: the attention views a new run clears."""
    e = EditHandlers(h)
    app.load(h.class_choices, [c.edit_model, c.edit_class], c.edit_class, api_name=False)
    c.edit_model.change(h.class_choices, [c.edit_model, c.edit_class], c.edit_class, api_name=False)
    c.edit_class.change(h.cfg_default, [c.edit_model, c.edit_class], c.edit_guidance, api_name=False)
    # an upload, an example, or cleared; photo_shown: which upload the editor holds
    # unqueued: the photo (or why it cannot be used) shows at once, not after a running job's queue turn
    c.photo.change(e.load_photo, c.photo, [c.editor, c.photo_text, c.photo_shown], api_name=False, queue=False)
    c.editing = c.edit_run.click(
        e.run_edit, [c.edit_model, c.edit_class, c.edit_guidance, c.editor, c.operation, c.sigma, c.strength, c.add_noise,
                     c.edit_steps, c.edit_seed, c.edit_pag, c.photo, c.photo_shown],
        [c.edit_result, c.edit_text, c.gen_state, c.image_idx, c.step, c.clickable, c.layer, c.head, *cleared, c.edit_status],
        concurrency_limit=1, concurrency_id="sampling", show_progress_on=[c.edit_status], api_name="edit")
    # each operation shows its own amount: the noise σ for denoise, the strength for edit
    c.operation.change(lambda op: (gr.update(visible=op.startswith("denoise")), gr.update(visible=op == "edit")),
                       c.operation, [c.sigma, c.strength], api_name=False, queue=False, show_progress="hidden")

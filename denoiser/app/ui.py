"""The web app's pages and handlers: generate images, then click any pixel to see where the U-Net attends.

UI wiring only; the work lives in `denoiser.explore.Explorer`. One sampling job runs at a time
(Gradio's queue shows the others their position); each browser session keeps its own generation in
`gr.State`, so sessions never see each other's images. Started by `denoiser.app.main` (`denoiser app`,
`python app.py`), which prepares the process before this module imports Gradio.

Memory: the server keeps the generations of the last `--max-sessions` sessions (each for 30 minutes at
most) and, with malloc held to two arenas, hands the memory it frees back to the system after every
sampling job (~60 ms); glibc otherwise keeps it. 100 fresh sessions of 64 images x 100 steps of the
tiny test model (~27 MB kept per session): before, 0.86 -> 2.65 GB and still +7 MB a session after
the 32nd; now 0.86 -> 1.73 GB, flat from the 35th session on.
"""

from __future__ import annotations

import argparse
import functools
import html
import logging
import queue
import random
import signal
import threading
import time
from pathlib import Path

import gradio as gr
import torch
from PIL import Image, ImageDraw

from denoiser.explore import LIMITS, RESTORE_OPERATIONS, SCHEDULERS, Explorer
from denoiser.fast import malloc
from denoiser.fast.kernels import load_kernels
from denoiser.image_io import open_image
from denoiser.pipeline import WEIGHTS_ENV, model_roots
from denoiser.sample import to_pil

log = logging.getLogger("denoiser.app")
# a model's images are 16-64 pixels: enlarged in the galleries, each pixel stays a sharp square
CSS = "#gallery img, #edit-result img, #preview img { image-rendering: pixelated; }"
DISPLAY = 256  # pixels of the clickable image; clicks are mapped back to the model's grid
# launch() settings every server of this app uses: uploads (a photo on the Edit tab) of at most 25 MB, what a
# phone or camera writes; image_io then refuses more than 50 megapixels before decoding
# show_error: Gradio's own input validation (e.g. a raw API call with steps: null) reaches the client as its
# message instead of "the upstream app has raised an exception"; our handlers' errors are already short
# and escaped (_user_error), so no traceback or server path is shown either way
# state_session_capacity: the sessions whose generations stay in memory (oldest dropped first; app.py's
# --max-sessions); with the work budget, one generation holds at most ~200 MB of step inputs (the 16x16 model: 64 images x 1000 steps)
LAUNCH = {"max_file_size": "25mb", "show_error": True, "state_session_capacity": 32, "css": CSS}
# the Edit tab paints on a copy of the photo at most this many pixels a side: the browser re-encodes what the
# editor holds as PNG on every run (a 2400x1800 JPEG of 600 KB became 8.4 MB), a copy this size stays ~1 MB
EDIT_PREVIEW = 512
# pictures for the Edit tab's examples, drawn for this project (MIT, like the code); shipped in the package
EXAMPLES = Path(__file__).resolve().parent / "examples"
SESSION_TTL_S = 1800  # a session's generation is dropped this long after its last update
HEARTBEAT_S = 0.5  # longest wait between yields of a running generation (how soon a cancel is seen)
PREVIEW_EVERY_S = 1.5  # at least this often a preview while sampling (DDPM-1000 never looks frozen)
CLEARED_VIEWS = (None, None, None, "")  # pixel, maps, stages, stage text after a new generation
NO_CLASS = "(any)"
# set once by Ctrl-C or SIGTERM (_serve): running sampling jobs stop at their next step, so that their
# requests end before the server closes, and no sampling thread is still in C++ when Python exits
STOPPING = threading.Event()


class Cancelled(Exception):
    """Raised inside the sampling loop's callback once the request that started it is gone."""


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


def progress_text(desc: str, done: int, total: int, elapsed: float) -> str:
    """ "sampling: step 12 / 50 · about 8 s left" (the rest estimated from the steps so far)."""
    left = elapsed / max(done, 1) * (total - done)
    when = f"about {left:.0f} s left" if left < 120 else f"about {left / 60:.0f} min left"
    return f"{desc}: step {done} / {total} · {when}" if done < total else f"{desc}: step {done} / {total}"


def _stream(job, progress, desc: str):
    """Run `job(on_step)` (a generation or an edit) in a worker thread; yield (x0 preview, progress text) as they
    come (None for what has not changed, at least every HEARTBEAT_S), then return its result. When the consumer is closed
    (Gradio's cancel, a closed tab), the worker stops at its next step and is joined first, so the
    queue slot frees only once the work has stopped."""
    previews: queue.Queue = queue.Queue()
    result: dict = {}
    stop = threading.Event()  # set when nobody listens any more
    last_preview = [time.monotonic()]  # DDPM-1000 still shows a fresh x0 every PREVIEW_EVERY_S
    started = time.monotonic()
    status = {"text": None}  # the latest "step k / N · about S s left"

    def on_step(i, total, x0):
        if stop.is_set() or STOPPING.is_set():
            raise Cancelled  # out of the sampling loop after the UNet call in progress
        status["text"] = progress_text(desc, i + 1, total, time.monotonic() - started)
        progress((i + 1) / total, desc=status["text"])
        now = time.monotonic()
        if i % max(1, total // 10) == 0 or i == total - 1 or now - last_preview[0] > PREVIEW_EVERY_S:
            last_preview[0] = now
            previews.put(x0)

    def work():
        try:
            result["value"] = job(on_step)
        except Cancelled:
            pass
        except Exception as err:  # noqa: BLE001 - every failure reaches the user as a readable message
            result["error"] = err
        finally:
            previews.put(None)

    worker = threading.Thread(target=work, name="denoiser-generate", daemon=True)
    worker.start()
    shown = [None]

    def fresh_text():
        text = status["text"]
        new, shown[0] = (text if text != shown[0] else None), text
        return new

    try:
        while True:
            try:
                x0 = previews.get(timeout=HEARTBEAT_S)
            except queue.Empty:  # yield now and then: a cancel can only close a generator at a yield
                yield None, fresh_text()
                continue
            if x0 is None:
                break
            yield to_pil(x0), fresh_text()
    finally:
        stop.set()
        worker.join()
        # the job's activations and the generations of sessions dropped since are free now: hand them back,
        # or glibc keeps them and the server's RSS stays at its highest (tests/test_app.py)
        malloc.release_free_memory()
    if "error" in result:
        raise _user_error(result["error"])
    if "value" not in result:  # cancelled while the request still listens: the server is stopping
        raise gr.Error("the server is shutting down: try again once it is back")
    return result["value"]


def _user_error(err: BaseException) -> gr.Error:
    """Any failure as a short, escaped message that names the problem: no traceback, no server paths. The
    server's log gets one line for a user's mistake (ValueError, FileNotFoundError, our own gr.Error) and the
    traceback only for a real failure."""
    if isinstance(err, gr.Error):
        if err.print_exception:
            log.info("user error: %s", err.message)
            err.print_exception = False
        return err
    user = isinstance(err, (ValueError, FileNotFoundError))
    text = str(err) if user else f"{type(err).__name__}: {err}"
    for root in model_roots():
        for form in {str(root), str(root.resolve())}:
            text = text.replace(form, "weights")
    if len(text) > 300:
        text = text[:300] + " …"
    if user:
        log.info("user error: %s", text)
    else:
        log.error("failed: %s", text, exc_info=err)
    return gr.Error(html.escape(text, quote=False), print_exception=False)


def friendly(handler):
    """A handler whose every exception reaches the browser as `_user_error`'s message."""

    @functools.wraps(handler)
    def wrapped(*args, **kwargs):
        try:
            return handler(*args, **kwargs)
        except Exception as err:  # noqa: BLE001
            raise _user_error(err) from None

    return wrapped


def _relay(stream, n_outputs: int, show, status: bool = False):
    """A handler's updates for each item of `_stream`: `show(preview)` in the first output and, with `status`,
    the progress text in the last; the rest untouched. Returns the stream's result. Closing the handler closes
    the stream (stopping its work)."""
    try:
        while True:
            try:
                preview, text = next(stream)
            except StopIteration as done:
                return done.value
            first = gr.skip() if preview is None else show(preview)
            last = ((gr.skip() if text is None else text),) if status else ()
            yield (first,) + (gr.skip(),) * (n_outputs - 1 - len(last)) + last
    finally:
        stream.close()


def _enlarge(img: Image.Image, target: int = DISPLAY) -> Image.Image:
    """Scale a small preview up by a whole factor, nearest-neighbour: pixels stay sharp squares."""
    factor = max(1, target // max(img.width, img.height))
    return img.resize((img.width * factor, img.height * factor), Image.Resampling.NEAREST) if factor > 1 else img


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


def photo_preview(path: str | None) -> tuple[Image.Image | None, str]:
    """An uploaded photo file -> (an RGB copy at most EDIT_PREVIEW pixels a side to paint on, a line saying so).
    Decoded with bounded memory (denoiser.image_io); a file that is no image raises a sentence without a path."""
    if path is None:
        return None, ""
    img = open_image(path, min_long_side=EDIT_PREVIEW, what="the upload")  # a JPEG decodes at a reduced scale
    w, h = img.info["source_size"]
    img.thumbnail((EDIT_PREVIEW, EDIT_PREVIEW), Image.Resampling.LANCZOS)
    return img, (f"your photo: {w}x{h}, shown at {img.width}x{img.height}; the model sees it at its own size. "
                 "To inpaint, paint over what to regenerate.")


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


def _parse_heads(text) -> list[int] | None:
    """'all' (or empty) -> None; '0, 2' -> [0, 2]."""
    text = str(text or "").strip().lower()
    if text in ("", "all"):
        return None
    try:
        return [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ValueError(f"heads must be 'all' or comma-separated numbers such as 0,2; got {text[:40]!r}") from None


def _run_controls(label: str, run_id: str, stop_id: str, status_id: str):
    """A job's Run and Stop buttons side by side, and the line under them that says how far the job is."""
    with gr.Row():
        run = gr.Button(label, variant="primary", elem_id=run_id, scale=3)
        stop = gr.Button("Stop", variant="stop", elem_id=stop_id, scale=1)
    return run, stop, gr.Markdown(elem_id=status_id)


def build_app(explorer: Explorer) -> gr.Blocks:
    models = explorer.models()
    preferred = [m for m in ("cifar10", "synthetic-shapes") if m in models]
    default = preferred[0] if preferred else (models[0] if models else None)

    def class_choices(model):
        try:
            names = explorer.classes(model) if model else []
        except ValueError:
            names = []
        return gr.update(choices=[NO_CLASS] + names, value=NO_CLASS, visible=bool(names))

    def generate(model, scheduler, steps, seed, num_images, class_name, guidance=1.0, pag_scale=0.0, guide_scale=1.0,
                 progress=gr.Progress()):
        try:
            classes = explorer.classes(model) if model else []
            if class_name not in (None, "", NO_CLASS) and class_name not in classes:
                raise ValueError(f"class {str(class_name)[:40]!r} is not one of this model's classes: {', '.join(classes) or 'none'}")
        except Exception as err:  # noqa: BLE001
            raise _user_error(err) from None
        label = classes.index(class_name) if class_name in classes else None

        def job(on_step):
            return explorer.generate(model, scheduler, steps, seed, num_images, label, on_step=on_step, guidance=guidance,
                                     pag_scale=pag_scale, guide_scale=guide_scale)

        gen = yield from _relay(_stream(job, progress, "denoising"), 12, _enlarge, status=True)
        gallery = [to_pil(gen.images[i : i + 1], nrow=1, padding=0) for i in range(gen.images.shape[0])]
        layers = explorer.layer_names(gen, gen.num_steps - 1)
        yield (
            _enlarge(to_pil(gen.images)), gallery, gen,
            _index_slider(gen.images.shape[0], 0),
            _index_slider(gen.num_steps, gen.num_steps - 1),
            _display(gen, 0, None),
            gr.update(choices=[(name, i) for i, name in enumerate(layers)], value=0),
            *CLEARED_VIEWS,
            f"done: {gen.images.shape[0]} image(s), {gen.num_steps} steps",
        )

    def run_edit(model, class_name, guidance, editor, operation, amount, add_noise, steps, seed, pag_scale=0.0,
                 progress=gr.Progress()):
        try:
            classes = explorer.classes(model) if model else []
            label = classes.index(class_name) if class_name in classes else None
            image, mask = _editor_layers(editor)
        except Exception as err:  # noqa: BLE001
            raise _user_error(err) from None

        def job(on_step):
            return explorer.restore(model, operation, image, mask, amount, add_noise, steps, seed, label, guidance,
                                    on_step=on_step, pag_scale=pag_scale)

        gen, noisy, text = yield from _relay(_stream(job, progress, operation), 12,
                                             lambda preview: [(image, "your image"), (_enlarge(preview), "predicted x0")],
                                             status=True)
        shown = [(image, "your image")] + ([(noisy, "noisy")] if noisy is not None else [])
        shown.append((to_pil(gen.images, nrow=1, padding=0), "result"))
        layers = explorer.layer_names(gen, gen.num_steps - 1)
        yield (
            shown, text, gen, _index_slider(1, 0), _index_slider(gen.num_steps, gen.num_steps - 1),
            _display(gen, 0, None), gr.update(choices=[(name, i) for i, name in enumerate(layers)], value=0),
            *CLEARED_VIEWS, f"done: {operation} with {model}, {gen.num_steps} step(s)",
        )

    def load_photo(path):
        """The photo into the editor; a file that cannot be used says why under the upload box (no path)."""
        try:
            image, text = photo_preview(path)
        except (ValueError, FileNotFoundError) as err:
            log.info("upload refused: %s", err)
            return None, f"**This file cannot be used:** {html.escape(str(err), quote=False)}"
        return ({"background": image, "layers": [], "composite": image} if image is not None else None), text

    @friendly
    def at_pixel(gen, image, step, y, x, layer, head, mean_steps=False):
        if gen is None:
            raise gr.Error("generate images first (Sample tab)")
        pixel = (y, x)
        try:
            if mean_steps:
                maps = explorer.mean_attention_maps(gen, image, pixel)
            else:
                maps = explorer.attention_maps(gen, image, step, pixel)
            stages, text = explorer.four_stages(gen, image, step, pixel, layer or 0, head or 0)
        except ValueError as err:
            raise _user_error(err) from None
        y, x = int(y), int(x)
        return (y, x), y, x, _display(gen, int(image), (y, x)), maps, stages, text

    @friendly
    def click(gen, image, step, layer, head, mean_steps, evt: gr.SelectData):
        if gen is None:
            raise gr.Error("generate images first (Sample tab)")
        y, x = click_to_pixel(evt.index, gen.images.shape[-1])
        return at_pixel(gen, image, step, y, x, layer, head, mean_steps)

    @friendly
    def refresh(gen, image, step, pixel, layer, head, mean_steps=False):
        """Every view at the current (image, step, pixel): the clickable image, the maps, the four stages."""
        if gen is None:
            return None, None, None, ""
        if pixel is None:
            return _display(gen, int(image), None), None, None, ""
        return at_pixel(gen, image, step, pixel[0], pixel[1], layer, head, mean_steps)[3:]

    def model_defaults(model):
        """(its sampling.json, whether it ships a guide) of the chosen model; none for a broken folder."""
        try:
            return explorer.sampling_defaults(model) if model else ({}, False)
        except ValueError:
            return {}, False

    def guidance_defaults(model):
        """The chosen model's own attention and autoguidance (its sampling.json); the autoguidance slider only
        where it ships a guide. Classifier-free guidance follows the class (cfg_default)."""
        d, has_guide = model_defaults(model)
        return (gr.update(value=d.get("pag_scale", 0.0)),
                gr.update(value=d.get("guide_scale", 1.0) if has_guide else 1.0, visible=has_guide))

    def cfg_default(model, class_name):
        """The model's classifier-free scale once a class is chosen; 1 (off) for "(any)", which it needs."""
        return gr.update(value=model_defaults(model)[0].get("guidance_scale", 1.0) if class_name not in (None, "", NO_CLASS) else 1.0)

    @friendly
    def head_stats(gen, image):
        if gen is None:
            raise gr.Error("generate images first (Sample tab)")
        rows, chart = explorer.head_table(gen, image)
        return chart, _head_rows(rows), gr.update(choices=list(dict.fromkeys(r.layer for r in rows)))

    def switch_off(gen, layers, heads, progress=gr.Progress()):
        try:
            if gen is None:
                raise ValueError("generate images first (Sample tab)")
            head_ids = _parse_heads(heads)
        except Exception as err:  # noqa: BLE001
            raise _user_error(err) from None

        def job(on_step):
            return explorer.ablate(gen, list(layers or []), head_ids, on_step=on_step)

        off = yield from _relay(_stream(job, progress, "switched off"), 2, lambda preview: _enlarge(preview))
        which = ", ".join(layers) + ("" if head_ids is None else f" (heads {', '.join(map(str, head_ids))})")
        yield (_enlarge(to_pil(torch.cat([gen.images, off.images]), nrow=gen.images.shape[0]), target=768),
               f"Top row: as generated. Bottom row: the same seed with **{which}** switched to identity attention "
               f"(each pixel attends only to itself). Mean pixel change: {float((off.images - gen.images).abs().mean()):.4f}")

    @friendly
    def restage(gen, image, step, pixel, layer, head):
        if gen is None or pixel is None:
            return None, ""
        try:
            return explorer.four_stages(gen, image, step, pixel, layer or 0, head or 0)
        except ValueError as err:
            raise _user_error(err) from None

    with gr.Blocks(title="denoiser", delete_cache=(300, 900), analytics_enabled=False) as app:
        gen_state = gr.State(None, time_to_live=SESSION_TTL_S)
        pixel_state = gr.State(None, time_to_live=SESSION_TTL_S)
        gr.Markdown("# denoiser — attention U-Net diffusion\nGenerate on the **Sample** tab, or denoise, edit and inpaint "
                    "your own photo on the **Edit** tab; then click any pixel on the **Attention** tab to see where each "
                    "attention layer of the U-Net looks; the **Heads** tab measures what each layer and head does and "
                    "switches them off.")
        with gr.Tab("Sample"):
            with gr.Row():
                with gr.Column(scale=1):
                    model = gr.Dropdown(models, value=default, label="model (folders under weights/)")
                    scheduler = gr.Dropdown(list(SCHEDULERS), value="ddim", label="scheduler", elem_id="scheduler")
                    steps = gr.Slider(*LIMITS["steps"], value=50, step=1, label="steps", elem_id="steps")
                    with gr.Row():
                        seed = gr.Number(value=0, precision=0, label="seed", minimum=LIMITS["seed"][0], maximum=LIMITS["seed"][1])
                        randomise = gr.Button("🎲 randomise", size="sm")
                    num_images = gr.Slider(*LIMITS["num_images"], value=8, step=1, label="images")
                    # custom values allowed: choices follow the chosen model; generate() validates them
                    class_name = gr.Dropdown([NO_CLASS], value=NO_CLASS, label="class", visible=False,
                                             allow_custom_value=True)
                    guidance = gr.Slider(*LIMITS["guidance"], value=1.0, step=0.5, label="guidance (with a class)", elem_id="cfg",
                                         info="classifier-free guidance: 2-3 makes the class clearer, 1 = off")
                    pag = gr.Slider(*LIMITS["pag_scale"], value=0.0, step=0.25, label="attention guidance (PAG)", elem_id="pag",
                                    info="steer away from the U-Net with its low-resolution decoder attention switched to identity: "
                                         "sharper structure, no class needed; 0 = off, one extra pass")
                    guide_w = gr.Slider(*LIMITS["guide_scale"], value=1.0, step=0.25, label="autoguidance", visible=False,
                                        elem_id="autoguidance",
                                        info="steer away from the model's small, less-trained guide model; 1 = off")
                    run, stop, status = _run_controls("Generate", "generate", "stop", "status")
                with gr.Column(scale=2):
                    preview = gr.Image(label="denoising (predicted x0)", format="png", type="pil", interactive=False,
                                       elem_id="preview")
                    gallery = gr.Gallery(label="results (lossless PNG)", format="png", columns=8, elem_id="gallery",
                                         buttons=["download", "download_all"])
            if models:  # full width, under both columns: a click fills the settings, then Generate
                first = sorted(models, key=lambda m: m != default)[:3]  # the default model first
                gr.Examples([[m, "ddim", 25, k, 8] for k, m in enumerate(first)],
                            [model, scheduler, steps, seed, num_images], label="try these")
        with gr.Tab("Edit"):
            with gr.Row():
                with gr.Column(scale=1):
                    photo = gr.File(label="your photo: JPEG, PNG or WebP, up to 50 megapixels and 25 MB",
                                    file_types=["image"], type="filepath", elem_id="photo", height=110)
                    photo_text = gr.Markdown(elem_id="photo-text")
                    # the editor gets a small copy of the photo (photo_preview): painting needs no more, and the
                    # browser sends the editor's content back as PNG on every run
                    editor = gr.ImageEditor(type="pil", sources=(), elem_id="editor", height=320,
                                            label="inpaint mask",  # short: the editor's toolbar covers long labels
                                            brush=gr.Brush(colors=["#ff00ff"], color_mode="fixed"))
                    operation = gr.Radio(list(RESTORE_OPERATIONS), value="denoise", label="operation")
                    # the Edit tab's own model, class and guidance: what runs is what this tab shows
                    edit_model = gr.Dropdown(models, value=default, label="model", elem_id="edit-model")
                    edit_class = gr.Dropdown([NO_CLASS], value=NO_CLASS, label="class (sampled denoise, edit, inpaint)",
                                             visible=False, allow_custom_value=True, elem_id="edit-class")
                    edit_guidance = gr.Slider(*LIMITS["guidance"], value=1.0, step=0.5, label="guidance (with a class)",
                                              elem_id="edit-cfg", info="classifier-free guidance; 1 = off, needs a class")
                    amount = gr.Slider(0, 1, value=0.0, step=0.01, label="denoise: noise σ of your image (0 = estimate); "
                                       "edit: strength (0 keeps, 1 samples anew)")
                    add_noise = gr.Slider(0, 0.5, value=0.0, step=0.01, label="add noise first (σ, 0 = off): the round trip, with PSNR")
                    edit_steps = gr.Slider(*LIMITS["steps"], value=50, step=1, label="steps (sampled denoise, edit, inpaint)")
                    edit_seed = gr.Number(value=0, precision=0, label="seed", minimum=LIMITS["seed"][0], maximum=LIMITS["seed"][1])
                    edit_pag = gr.Slider(*LIMITS["pag_scale"], value=0.0, step=0.25, label="attention guidance (PAG)",
                                         info="for sampled denoise, edit and inpaint; 0 = off")
                    edit_run, edit_stop, edit_status = _run_controls("Run", "edit-run", "edit-stop", "edit-status")
                    gr.Examples([[str(f)] for f in sorted(EXAMPLES.glob("*.png"))], [photo], label="try a picture")
                with gr.Column(scale=2):
                    edit_result = gr.Gallery(label="before and after", format="png", columns=3, elem_id="edit-result",
                                             object_fit="contain", height="auto")
                    edit_text = gr.Markdown(elem_id="edit-text")
        with gr.Tab("Attention", elem_id="attention-tab"):
            gr.Markdown("Click any pixel of the image to see where each attention layer looks from it. Nothing here "
                        "yet? Generate on the **Sample** tab or run the **Edit** tab first.", elem_id="attention-hint")
            with gr.Row():
                with gr.Column(scale=1):
                    # shown once there is a generation (their ranges follow it)
                    image_idx = gr.Slider(0, 1, value=0, step=1, label="image", visible=False)
                    step = gr.Slider(0, 1, value=0, step=1, label="denoising step", visible=False)
                    clickable = gr.Image(label="click a pixel", format="png", type="pil", interactive=False,
                                         elem_id="clickable")
                    with gr.Row():
                        py = gr.Number(value=0, precision=0, minimum=0, label="pixel y")
                        px = gr.Number(value=0, precision=0, minimum=0, label="pixel x")
                        show_btn = gr.Button("show", size="sm")
                    layer = gr.Dropdown([], label="layer (four stages)", elem_id="layer", allow_custom_value=True)
                    head = gr.Number(value=0, precision=0, minimum=0, label="head (four stages)")
                    mean_steps = gr.Checkbox(False, label="maps: averaged over every step of the chain (one U-Net call per step)")
                with gr.Column(scale=2):
                    # titles above the images: a floating label would cover the first row's layer names
                    gr.Markdown("**Attention of the clicked pixel**: one row per layer, mean of heads, then each head")
                    maps = gr.Image(show_label=False, format="png", type="pil", interactive=False, elem_id="maps")
                    gr.Markdown("**The four stages** for one layer and head")
                    stages = gr.Image(show_label=False, format="png", type="pil", interactive=False, elem_id="stages")
                    stage_text = gr.Markdown()

        with gr.Tab("Heads", elem_id="heads-tab"):
            gr.Markdown("What each attention layer and head does for the chosen image (Attention tab's image slider), "
                        "at four noise levels: how far it looks (mean distance in image pixels), how spread its weights "
                        "are (entropy / log N: 1 = uniform), how much a pixel keeps of itself, and how much the U-Net's "
                        "output changes when the layer or head is switched to identity attention.")
            with gr.Row():
                with gr.Column(scale=1):
                    stats_run = gr.Button("Compute statistics", variant="primary", elem_id="stats-run")
                    off_layers = gr.Dropdown([], multiselect=True, label="layers to switch off", elem_id="off-layers")
                    off_heads = gr.Textbox("all", label="heads to switch off (all, or e.g. 0,2)", elem_id="off-heads")
                    off_run = gr.Button("Switch off and regenerate (same seed)", elem_id="off-run")
                with gr.Column(scale=2):
                    gr.Markdown("**Per layer** (heads averaged), over the noise level t (noisy on the left)")
                    stats_chart = gr.Image(show_label=False, format="png", type="pil", interactive=False, elem_id="stats-chart")
                    stats_table = gr.Dataframe(headers=HEAD_COLUMNS, label="layers x heads (mean over the noise levels; "
                                               "head -1 = the whole layer)", elem_id="stats-table", interactive=False)
                    gr.Markdown("**Switched off**: as generated (top row), the same seed without the chosen attention (bottom)")
                    off_image = gr.Image(show_label=False, format="png", type="pil", interactive=False, elem_id="off-image")
                    off_text = gr.Markdown()

        app.load(class_choices, model, class_name, api_name=False)
        model.change(class_choices, model, class_name, api_name=False)
        app.load(guidance_defaults, model, [pag, guide_w], api_name=False)
        model.change(guidance_defaults, model, [pag, guide_w], api_name=False)
        class_name.change(cfg_default, [model, class_name], guidance, api_name=False)
        app.load(class_choices, edit_model, edit_class, api_name=False)
        edit_model.change(class_choices, edit_model, edit_class, api_name=False)
        edit_class.change(cfg_default, [edit_model, edit_class], edit_guidance, api_name=False)
        stats_run.click(head_stats, [gen_state, image_idx], [stats_chart, stats_table, off_layers], concurrency_limit=1,
                        concurrency_id="sampling", api_name="heads")
        off_run.click(switch_off, [gen_state, off_layers, off_heads], [off_image, off_text], concurrency_limit=1,
                      concurrency_id="sampling", api_name="switch_off")
        randomise.click(lambda: random.randint(0, 2**31 - 1), None, seed, api_name=False)
        cleared = [pixel_state, maps, stages, stage_text]  # a new generation: no pixel, no maps of the old one
        generating = run.click(generate, [model, scheduler, steps, seed, num_images, class_name, guidance, pag, guide_w],
                               [preview, gallery, gen_state, image_idx, step, clickable, layer, *cleared, status],
                               concurrency_limit=1, concurrency_id="sampling", api_name="generate")
        photo.change(load_photo, photo, [editor, photo_text], api_name=False)  # an upload, an example, or cleared
        editing = edit_run.click(run_edit, [edit_model, edit_class, edit_guidance, editor, operation, amount, add_noise,
                                            edit_steps, edit_seed, edit_pag],
                                 [edit_result, edit_text, gen_state, image_idx, step, clickable, layer, *cleared, edit_status],
                                 concurrency_limit=1, concurrency_id="sampling", api_name="edit")
        # Stop: Gradio closes the running handler at its next yield (at most HEARTBEAT_S), _stream then stops the
        # worker after the UNet call in progress and frees the sampling slot
        stop.click(None, None, None, cancels=[generating], api_name=False)
        edit_stop.click(None, None, None, cancels=[editing], api_name=False)
        pixel_outputs = [pixel_state, py, px, clickable, maps, stages, stage_text]
        views = [gen_state, image_idx, step, pixel_state, layer, head, mean_steps]
        image_idx.change(refresh, views, [clickable, maps, stages, stage_text], api_name=False)
        step.change(refresh, views, [clickable, maps, stages, stage_text], api_name="refresh")
        mean_steps.change(refresh, views, [clickable, maps, stages, stage_text], api_name=False)
        clickable.select(click, [gen_state, image_idx, step, layer, head, mean_steps], pixel_outputs, api_name=False)
        show_btn.click(at_pixel, [gen_state, image_idx, step, py, px, layer, head, mean_steps], pixel_outputs,
                       api_name="attention")
        for control in (layer, head):
            control.change(restage, [gen_state, image_idx, step, pixel_state, layer, head], [stages, stage_text], api_name=False)
    return app


def _parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="denoiser app", description="denoiser web app")
    p.add_argument("--host", default="127.0.0.1", help="interface to bind (default: localhost only)")
    p.add_argument("--port", type=int, default=7860)
    p.add_argument("--share", action="store_true", help="create a public Gradio share link")
    p.add_argument("--weights", default=None,
                   help=f"folder of model folders (default: ${WEIGHTS_ENV}, then a clone's weights/)")
    p.add_argument(
        "--max-sessions",
        type=int,
        default=LAUNCH["state_session_capacity"],
        help="sessions whose generation stays in memory, oldest dropped first (default: %(default)s)",
    )
    args = p.parse_args(argv)
    if args.weights is not None and not Path(args.weights).is_dir():
        raise SystemExit(f"weights folder {args.weights!r} does not exist")
    if args.weights is None and not any(r.is_dir() for r in model_roots()):
        raise SystemExit(f"no models to serve: set {WEIGHTS_ENV} to a folder of model folders or pass --weights FOLDER")
    if args.max_sessions < 1:
        raise SystemExit(f"--max-sessions must be at least 1, got {args.max_sessions}")
    return args


def _serve(args: argparse.Namespace) -> None:
    """Serve until Ctrl-C or SIGTERM."""
    # before any handler thread allocates: Gradio runs handlers on a pool of threads, and glibc would give
    # each its own arena, whose free memory no other thread reuses (denoiser/malloc.py)
    malloc.configure(arena_max=2)
    load_kernels()  # the C++ kernels built at install (`denoiser build-kernels`); loading never compiles
    app = build_app(Explorer(args.weights))  # None: $DENOISER_WEIGHTS, then a clone's weights/
    launch = {**LAUNCH, "state_session_capacity": args.max_sessions}
    app.queue(default_concurrency_limit=2).launch(server_name=args.host, server_port=args.port, share=args.share,
                                                  prevent_thread_lock=True, **launch)  # fmt: skip

    def close(signum, frame) -> None:
        """Ctrl-C, and SIGTERM (kill, systemd, docker stop) alike: running sampling jobs stop at their next
        step, then Gradio ends its streams and closes the server (waiting at most 5 s for open requests)."""
        STOPPING.set()
        app.close()

    signal.signal(signal.SIGINT, close)
    signal.signal(signal.SIGTERM, close)
    while app.is_running:
        time.sleep(0.1)


def run(argv: list[str] | None = None) -> None:
    """Parse the app's arguments and serve until Ctrl-C or SIGTERM; running sampling jobs end first."""
    handler = logging.StreamHandler()  # the app's own lines (one per user error); other libraries keep theirs
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s: %(message)s", "%H:%M:%S"))
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    try:
        _serve(_parse_args(argv))
    finally:
        STOPPING.set()
        for worker in [t for t in threading.enumerate() if t.name == "denoiser-generate"]:
            worker.join(timeout=30)  # it stops at its next step; Python must not exit while it is in C++

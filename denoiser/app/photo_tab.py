"""The Photo tab: your own photo denoised (at its own size, in tiles), denoised by sampling, edited or inpainted.
One module: its components (`PhotoTab.build`), its handlers and its wiring (`PhotoTab.wire`); the work is the
engine's (denoiser/app/engine.py), the attention views of a run's generation the Attention tab's (`AttentionTab.show`).

The photo (its upload kept for the session, the copy the editor paints on) is denoiser/app/photo.py's. A run
streams its progress into the tab's live preview; the results and the text under them change only when a run
finishes, so after Stop they are still the last run's.
"""

from __future__ import annotations

import html
import logging
import os
import tempfile
from pathlib import Path

import gradio as gr
from PIL import Image

from denoiser.app.attention_tab import AttentionTab
from denoiser.app.controls import (
    JOB,
    SESSION_TTL_S,
    form_slider,
    on_any_change,
    queued,
    run_controls,
    selected_index,
    stop_controls,
    whole_box,
)
from denoiser.app.engine import RESTORE_OPERATIONS
from denoiser.app.form import NO_CLASS, guidance_info
from denoiser.app.form_limits import LIMITS, check_int
from denoiser.app.page import Page
from denoiser.app.photo import (
    EDITOR_SIDE,
    centre_square,
    drop_upload,
    editor_picture,
    keep_upload,
    photo_file,
    photo_input,
    photo_preview,
)
from denoiser.app.png_settings import read_settings, save_with_settings, tab_of
from denoiser.app.views import enlarge
from denoiser.atomic import atomic_path
from denoiser.request import BUILT_IN
from denoiser.restore.plan import RestoreResult, read_photo, scaled_size, takes_prompt

__all__ = ["PhotoTab", "restored_text", "EXAMPLES", "CLEAN_SIGMA", "PHOTO_FORM"]

log = logging.getLogger("denoiser.app")
# pictures for the Photo tab's examples, drawn for this project (MIT, like the code); shipped in the package
EXAMPLES = Path(__file__).resolve().parent / "examples"
# a noise level σ below this ([0, 1] pixel scale, ~2.5/255) is a clean picture: denoising leaves it as it is
CLEAN_SIGMA = 0.01
# the live preview's label once its run was stopped (by tiled: a photo's denoise in tiles, or a sampled chain)
STOPPED_PREVIEW = {True: "stopped: the tiles denoised before Stop", False: "stopped: the predicted x₀ at Stop"}
# the Photo tab's form as a result's PNG carries it (denoiser.app.png_settings.save_with_settings), in `PhotoTab.form`'s
# order
PHOTO_FORM = ("model", "class", "guidance_scale", "operation", "sigma", "strength", "add_noise", "steps", "seed", "pag_scale",
             "prompt")


def _sigma_text(sigma: float | None, given: float) -> str:
    """The noise level σ a denoise removed, in words; for a clean picture, what to do to see a change."""
    if sigma is None:
        return ""
    how = "as you set it" if given else "estimated from your picture"
    text = f" Noise level σ removed: **{sigma:.3f}** ({sigma * 255:.1f}/255, {how})."
    if sigma < CLEAN_SIGMA:
        text += (" **Your picture is already clean (σ ≈ 0): denoising leaves it as it is.** To see the round trip, "
                 "set **add noise first** (e.g. 0.1): noise is added, then removed, scored by PSNR.")
    return text


def restored_text(operation: str, done: RestoreResult, given_sigma: float = 0.0) -> str:
    """What the Photo tab did, in one paragraph, pointing to where to look next."""
    s, size = done.settings, done.model_size
    w, h = done.source_size
    if s["chain"]:
        text = f"**{operation}**: {w}x{h} input, resized and centre-cropped to {size}x{size}; {done.steps} step(s)."
    else:
        text = f"**{operation}**: {w}x{h} input, denoised at its own size in overlapping {size}x{size} tiles"
        if s.get("scaled_from"):
            text += (f" — **a copy scaled to {done.image.width}x{done.image.height}**: the photo is over this server's "
                     "photo budget")
        text += f" (the model's size; {done.tiles:,} tiles)."
    if done.psnr is not None:
        text += f" PSNR against your image: noisy {done.psnr[0]:.2f} dB, result {done.psnr[1]:.2f} dB."
    text += _sigma_text(done.sigma, given_sigma if done.psnr is None else 1.0)
    if s["chain"]:
        return text + " Open the **Attention** tab to see where the U-Net looked."
    return text + f" The result downloads at {done.image.width}x{done.image.height}."


def _write_png(img: Image.Image, folder: Path, name: str) -> str:
    path = folder / name
    with atomic_path(path) as tmp:  # a reader never sees half a picture (denoiser.atomic)
        img.save(tmp, format="PNG", compress_level=1)  # a picture to look at: fast over small
    return str(path)


def mask_brush(size: tuple[int, int]) -> gr.Brush:
    """The inpaint brush for a picture of `size` (as the editor shows it): a twentieth of its shorter side, so a stroke
    marks a part of a 64x64 emoji as of a photo (Gradio's own size covered 80 % of a 64x64 picture in one stroke)."""
    return gr.Brush(colors=["#ff00ff"], color_mode="fixed", default_size=max(1, round(min(size) / 20)))


class PhotoTab:
    """The Photo tab of one page."""

    def __init__(self, page: Page) -> None:
        self.page, self.engine, self.jobs = page, page.engine, page.jobs

    def build(self) -> None:
        self.photo_shown = gr.State(None)  # the upload the editor holds
        # the session's copy of its upload (keep_upload): removed when the session ends or its photo is replaced
        self.upload = gr.State(None, time_to_live=SESSION_TTL_S, delete_callback=drop_upload)
        self.selected = gr.State(0)  # the result selected in the Photo tab's gallery
        self.prompt_restored = gr.State(None)  # the prompt "use these settings" just filled (prompt_changed)
        with gr.Tab("Photo"):
            with gr.Row():
                with gr.Column(scale=1):
                    self._photo_column()
                # Run, Stop, the progress, the live preview and the results together, beside the photo (on a phone:
                # under it)
                with gr.Column(scale=1):
                    self._results_column()
                with gr.Column(scale=1):
                    self._settings_column()

    def _photo_column(self) -> None:
        """The photo: its upload box, what it is, the editor the inpaint mask is painted on, example pictures."""
        self.sizes_note = gr.Markdown("Denoise keeps your photo's size; denoise (sampled), edit and inpaint work on its "
                                      "centre square at the model's size.", elem_id="photo-sizes")
        self.photo = gr.File(label="your photo: JPEG, PNG or WebP, up to 25 MB", file_types=["image"], type="filepath",
                             elem_id="photo", height=110)
        self.photo_text = gr.Markdown(elem_id="photo-text")
        # the editor gets a small copy of the photo (photo_preview): painting needs no more, and the browser sends the
        # editor's content back as PNG on every run
        self.editor = gr.ImageEditor(type="pil", sources=(), elem_id="editor", height=320,
                                     label="inpaint mask",  # short: the editor's toolbar covers long labels
                                     brush=mask_brush((EDITOR_SIDE, EDITOR_SIDE)))
        gr.Examples([[str(f)] for f in sorted(EXAMPLES.glob("*.png"))], [self.photo], label="try a picture")

    def _results_column(self) -> None:
        self.run, self.stop, self.status = run_controls("Run", "photo-run", "photo-stop", "photo-status")
        self.scope_note = gr.Markdown(elem_id="photo-scope")  # what Run will do with this form
        # shown while a run goes on: the results below stay the last finished run's (after Stop too)
        self.preview = gr.Image(label="running: the predicted clean image (x₀) so far", format="png", type="pil",
                                interactive=False, elem_id="photo-preview", height=220, visible=False)
        # "fit-content": as tall as its pictures (Gradio's "auto" keeps a 450-pixel minimum, mostly empty)
        self.result = gr.Gallery(label="before and after (lossless PNG; the result named after and carrying its "
                                       "settings)", format="png", columns=3, elem_id="photo-result", object_fit="contain",
                                 height="fit-content", type="filepath", interactive=False, buttons=["download"])
        self.text = gr.Markdown(label="result in numbers", show_label=False, elem_id="photo-result-text")
        self.use_selected = gr.Button("use these settings (the selected result's)", size="sm",
                                      elem_id="photo-use-settings")

    def _settings_column(self) -> None:
        """The operation and its settings; the tab's own model, class and guidance: what runs is what this tab shows."""
        self.operation = gr.Radio(list(RESTORE_OPERATIONS), value="denoise", label="operation", elem_id="operation",
                                  info="denoise: one prediction, your photo at its size; denoise (sampled): the reverse "
                                       "chain; edit: redraw (SDEdit); inpaint: regenerate what you paint")
        self.model = gr.Dropdown(self.page.models, value=self.page.default_model, label="model", elem_id="photo-model")
        self.class_name = gr.Dropdown([NO_CLASS], value=NO_CLASS, label="class (sampled denoise, edit, inpaint)",
                                      visible=False, allow_custom_value=True, elem_id="photo-class")
        # a text model's prompt: what edit and inpaint redraw toward (shown for those, emptied when hidden)
        self.prompt = gr.Textbox("", label="prompt (edit, inpaint)", elem_id="photo-prompt", visible=False, max_lines=2,
                                 placeholder="e.g. red apple; empty: no condition",
                                 info="what the redrawn pixels should show; typing one sets the guidance to the model's")
        self.guidance = form_slider(*LIMITS["guidance_scale"], value=1.0, step=0.5, label="guidance (with a class)",
                                    elem_id="photo-cfg", info=guidance_info())
        # one slider per meaning, the one the operation uses shown
        self.sigma = form_slider(*LIMITS["sigma"], value=0.0, step=0.01, label="how noisy your photo is (0 = estimate it)",
                                 elem_id="sigma", info="noise level σ on the 0..1 pixel scale (0.04 ≈ 10/255)")
        self.strength = form_slider(*LIMITS["strength"], value=BUILT_IN["strength"], step=0.01, label="edit strength",
                                    elem_id="strength", visible=False,
                                    info="0.1-0.3 keeps your picture and redraws its details; from about 0.5 the model "
                                         "replaces it with a picture of its own")
        self.add_noise = form_slider(*LIMITS["add_noise"], value=0.0, step=0.01, label="add noise first (0 = off)",
                                     elem_id="add-noise", info="noise level σ added, then removed (the round trip, with "
                                                               "PSNR)")
        with gr.Row():
            self.steps = whole_box("steps", BUILT_IN["steps"], "steps (sampled denoise, edit, inpaint)", "photo-steps")
            self.seed = whole_box("seed", 0, "seed", "photo-seed")
        self.pag = form_slider(*LIMITS["pag_scale"], value=0.0, step=0.25, label="attention guidance", elem_id="photo-pag",
                               info="perturbed-attention guidance (PAG), for sampled denoise, edit and inpaint; 0 = off")

    @property
    def form(self) -> list:
        """The tab's form in PHOTO_FORM's order: a result's PNG carries it, "use these settings" fills it."""
        return [self.model, self.class_name, self.guidance, self.operation, self.sigma, self.strength, self.add_noise,
                self.steps, self.seed, self.pag, self.prompt]

    def wire(self, app: gr.Blocks) -> None:
        form = self.page.form
        queued(self.run, self.status, self.jobs)  # the click noted first: its queue place, and a Stop while it waits
        scope_inputs = [self.model, self.operation, self.add_noise, self.upload]
        app.load(form.class_choices, [self.model, self.class_name], self.class_name, api_name=False, queue=False)
        app.load(self.sizes, self.model, self.sizes_note, api_name=False, queue=False)
        self.model.change(form.class_choices, [self.model, self.class_name], self.class_name, api_name=False)
        self.model.change(self.sizes, self.model, self.sizes_note, api_name=False, show_progress="hidden")
        # a person's choice of model or class sets the guidance to the model's; "use these settings" keeps the result's
        self.model.input(form.cfg_default, [self.model, self.class_name], self.guidance, api_name=False)
        self.class_name.input(form.cfg_default, [self.model, self.class_name], self.guidance, api_name=False)
        # an upload, an example, or cleared; photo_shown: which upload the editor holds; upload: the session's copy
        # unqueued: the photo (or why it cannot be used) shows at once, not after a running job's queue turn
        self.photo.change(self.load_photo, [self.photo, self.upload, self.model],
                          [self.editor, self.photo_text, self.photo_shown, self.upload], api_name=False, queue=False
                          ).then(self.scope, scope_inputs, self.scope_note, api_name=False, queue=False)
        on_any_change([self.model, self.operation, self.add_noise], self.scope, scope_inputs, self.scope_note, load=app,
                      queue=False, show_progress="hidden")  # Run's scope, said before it runs
        # a text model's prompt box for edit and inpaint, however the model or operation was set; a typed prompt sets
        # the guidance to the model's (cleared: 1, what an unconditioned run needs)
        on_any_change([self.model, self.operation], self.prompt_box, [self.model, self.operation], self.prompt,
                      queue=False, show_progress="hidden")
        # .change, not .input: a paste or a program's fill sets it as typing does (Gradio's .input misses them)
        self.prompt.change(self.prompt_changed, [self.model, self.class_name, self.prompt, self.prompt_restored],
                           [self.guidance, self.prompt_restored], api_name=False,
                           trigger_mode="always_last")  # typing fast: the last keystroke's text decides
        # what a run sets (the /photo API returns them in this order): the results, their text, the generation and its
        # views (the Attention tab's), the preview, the upload's state, the status line
        outputs = [self.result, self.text, *self.page.tab(AttentionTab).generation_outputs, self.preview, self.upload,
                   self.status]
        inputs = [self.model, self.class_name, self.guidance, self.editor, self.operation, self.sigma, self.strength,
                  self.add_noise, self.steps, self.seed, self.pag, self.photo, self.photo_shown, self.upload, self.prompt]
        self.run.click(self.run_photo, inputs, outputs, api_name=False, **JOB)
        # the /photo API: the page's inputs, its model a twin that takes any name, so that a model that does not exist
        # is the handler's refusal, one line of the log (the page's dropdown check logged Gradio's traceback)
        with gr.Row(visible=False):
            api_model = gr.Dropdown(self.page.models, value=self.page.default_model, label="model",
                                    allow_custom_value=True)
            api_door = gr.Button()
        api_door.click(self.run_photo, [api_model, *inputs[1:]], outputs, api_name="photo", **JOB)
        self.result.select(selected_index, None, self.selected, api_name=False)
        self.use_selected.click(self.restore_form, [self.result, self.selected, self.upload],
                                [*self.form, self.status, self.prompt_restored], api_name=False)
        # each operation shows its own amount: the noise σ for denoise, the strength for edit
        self.operation.change(lambda op: (gr.update(visible=op.startswith("denoise")), gr.update(visible=op == "edit")),
                              self.operation, [self.sigma, self.strength], api_name=False, queue=False,
                              show_progress="hidden")
        stop_controls(self.stop, self.status, self.jobs)

    def run_photo(self, model, class_name, guidance_scale, editor, operation, sigma, strength, add_noise, steps, seed,
                  pag_scale=0.0, photo=None, shown=None, upload=None, prompt=None, progress=gr.Progress(),
                  request: gr.Request = None):
        """photo: the uploaded file; shown: the upload the editor holds (it may still hold the previous one while
        a new upload loads); upload: the session's copy of it (keep_upload); prompt: a text model's, for edit and
        inpaint. One restore request (Engine.restore_request) through one run (Engine.restore): a one-step denoise
        keeps the photo's size (a copy scaled to the photo budget when it is over it), the others work on its centre
        square. The results, their text and the attention views change only once the run has finished; while it
        runs, the live preview shows how far it is."""
        try:
            classes = self.engine.classes(model) if model else []
            label = classes.index(class_name) if class_name in classes else None
            source = photo_file(photo, upload)
            steps = check_int("steps", steps, *LIMITS["steps"])  # the page's box: empty or 2.5 refused, not run as 1 or 2
            # `restore`, not `request`: that name is the page's gr.Request, which says whose job this is (running)
            restore = self.engine.restore_request(operation, label, guidance_scale, pag_scale, sigma,
                                                  strength if operation == "edit" else None, add_noise, steps, seed, prompt)
            if restore.tiled:
                image, mask = self._whole_photo(model, source, editor, restore), None
            else:  # the photo decoded as every door decodes it, the mask as painted on its copy in the editor
                size = self.engine.loaded(model).unet.config.sample_size
                image, mask = photo_input(editor, source, photo, shown, operation,
                                          lambda path: read_photo(path, restore, size, what="the upload"))
        except Exception as err:  # noqa: BLE001 - said on the status line, then raised (the toast; an API caller's)
            yield from self.jobs.refuse(request, self.status, err)

        def job(on_step):
            return self.engine.restore(model, restore, image, mask, on_step=on_step)

        preview, what = (self._tiles_preview, "denoise (tiles)") if restore.tiled else (self._preview, operation)
        unit = "tile" if restore.tiled else "step"  # a photo's progress counts its tiles, and says so
        stopped = {self.preview: gr.update(label=STOPPED_PREVIEW[restore.tiled])}  # no longer "running:"
        ran = yield from self.jobs.run(request, self.status, job, progress, what, self.preview, preview, unit, stopped)
        if ran is None:  # stopped: its line says where
            return
        gen, done = ran
        folder = Path(tempfile.mkdtemp(prefix="photo-", dir=os.environ.get("GRADIO_TEMP_DIR")))
        # "your image" in the result's framing: the photo (or its scaled copy), or the centre square the model sees
        yours = done.input if restore.tiled else centre_square(image)
        shown = [(_write_png(yours, folder, "your-image.png"), "your image")]
        if done.noisy is not None:
            shown.append((_write_png(done.noisy, folder, "noisy.png"), f"noisy (σ {done.settings['add_noise']:g} added)"))
        settings = {"model": model, **done.settings, "operation": operation}  # the form's name of the operation
        settings.pop("method")  # the operation's name says it
        shown.append((str(save_with_settings(done.image, folder, settings)), "result"))
        views = self.page.tab(AttentionTab).show(gen) if gen is not None else {}  # tiles are no generation
        w, h = done.image.size
        scaled = (f", a copy scaled from {done.settings['scaled_from'][0]}x{done.settings['scaled_from'][1]} to the photo "
                  "budget") if done.settings.get("scaled_from") else ""
        what = f"{gen.num_steps} step(s)" if gen is not None else f"at {w}x{h}{scaled}"
        # the upload's state set again: its time to live starts again
        yield self.jobs.done(request, self.status, {
            self.result: shown, self.text: restored_text(operation, done, float(sigma or 0)), **views,
            self.preview: gr.update(visible=False), self.upload: upload,
            self.status: f"done: {operation} with {model}, {what}, {done.settings['precision']}"})  # what ran

    def _whole_photo(self, model, source: str | None, editor, restore) -> Image.Image:
        """The photo for the tiled denoise: decoded once (read_photo, every door's rule), and no larger than the photo
        budget lets it run (a JPEG over it decodes at a reduced scale; Engine.restore scales it the rest of the way)."""
        if not source:  # an API call: the editor's picture
            return editor_picture(editor)[0]
        size = self.engine.loaded(model).unet.config.sample_size
        return read_photo(source, restore, size, max_pixels=self.engine.photo_limit(model) * 1e6, what="the upload")

    @staticmethod
    def _preview(preview: Image.Image) -> dict:
        return gr.update(value=enlarge(preview), visible=True, label="running: the predicted clean image (x₀) so far")

    @staticmethod
    def _tiles_preview(preview: Image.Image) -> dict:
        return gr.update(value=preview, visible=True, label="running: your photo, its tiles denoised so far (top first)")

    def load_photo(self, path, upload=None, model=None):
        """The photo into the editor, which upload it shows and the session's copy of it (the previous copy
        removed); a file that cannot be used says why under the upload box (no path), and a photo over the chosen
        model's photo budget says that a denoise runs on a copy scaled down to it."""
        drop_upload(upload)
        try:
            image, text = photo_preview(path)
        except (ValueError, FileNotFoundError) as err:
            log.info("upload refused: %s", err)
            return None, f"**This file cannot be used:** {html.escape(str(err), quote=False)}", path, None
        if image is None:
            return None, text, path, None
        if model:
            text += self._over_budget(model, *image.info["source_size"])
        if made := read_settings(path):  # a result of this app, dropped back in: which tab's form its settings fill
            text += (" **This PNG was made by this app: “use these settings” fills the form with what made it.**"
                     if tab_of(made) == "Photo" else " **This PNG was made by this app on the Sample tab:** “use these "
                     "settings” fills here its model, class, prompt, guidance, steps and seed (the Sample tab's form "
                     "takes all its settings).")
        value = {"background": image, "layers": [], "composite": image}
        return gr.update(value=value, brush=mask_brush(image.size)), text, path, keep_upload(path)

    def _over_budget(self, model, width: int, height: int) -> str:
        """For a photo over `model`'s photo budget: a sentence saying its denoise runs on a scaled copy ('' otherwise)."""
        try:
            limit = self.engine.photo_limit(model)
        except (ValueError, OSError, TypeError):
            return ""
        if width * height <= limit * 1e6:
            return ""
        return (f" **It is {width * height / 1e6:.1f} megapixels, over this server's photo budget for {model} "
                f"({limit:.1f}):** denoise runs on a copy scaled down to that, and the result's name says so.")

    def sizes(self, model) -> str:
        """The note above the upload box: the largest photo the chosen model denoises at its own size (the photo budget:
        what this server denoises in DENOISER_PHOTO_SECONDS at its measured speed)."""
        try:
            limit, size = self.engine.photo_limit(model), self.engine.loaded(model).unet.config.sample_size
            minutes = self.engine.photo_time(model, 1, 1).budget / 60
        except (ValueError, OSError, TypeError):
            return ""
        return (f"Denoise keeps your photo's size up to **{limit:.1f} megapixels** with {model} (what this server "
                f"denoises in {minutes:g} minutes; a larger photo is denoised as a copy scaled down to it). Denoise "
                f"(sampled), edit and inpaint work on its centre square at the model's size ({size}x{size}).")

    def scope(self, model, operation, add_noise, upload) -> str:
        """What Run will do with this form, said before it runs (RestoreRequest.tiled: one rule): the whole photo
        (the round trip included), or its centre square at the model's size."""
        try:
            size = self.engine.loaded(model).unet.config.sample_size
        except (ValueError, OSError, TypeError):
            return ""
        if operation != "denoise":
            return f"Run: **{operation}** on the centre square of your photo at the model's size ({size}x{size})."
        run = self._run_size(model, upload)  # (w, h) of the copy Run denoises when it is scaled down, else None
        photo = "your whole photo" if run is None else f"a copy of your photo scaled down to {run[0]}x{run[1]}"
        if float(add_noise or 0):
            what = (f"Run: **noise σ {float(add_noise):g} is added to {photo}, then removed** (the round trip, "
                    f"scored by PSNR), in tiles of the model's size")
        elif run is None:
            what = "Run: **denoise your whole photo at its own size**, in tiles of the model's size"
        else:
            what = f"Run: **denoise {photo}** (your photo is over the photo budget), in tiles of the model's size"
        return what + self._expected_wait(model, upload) + "."

    def _sizes(self, model, upload) -> tuple[int, int, int, int] | None:
        """(width, height) of the kept upload and (w, h) of what Run denoises (Engine.restore's rule: the photo, or a
        copy scaled down to the photo budget); None without one, or for a file that is no picture."""
        if not isinstance(upload, dict) or not upload.get("copy"):
            return None
        try:
            with Image.open(upload["copy"]) as img:  # the header's size: the tiles do not depend on its orientation
                width, height = img.size
            return (width, height, *scaled_size(width, height, self.engine.fitting_pixels(model, width, height)))
        except (ValueError, OSError, TypeError, AttributeError):
            return None

    def _run_size(self, model, upload) -> tuple[int, int] | None:
        """(w, h) of the copy Run denoises where the upload is over the photo budget; None where it runs at its own size."""
        sizes = self._sizes(model, upload)
        return None if sizes is None or sizes[:2] == sizes[2:] else sizes[2:]

    def _expected_wait(self, model, upload) -> str:
        """How long the tiled denoise of the kept upload will take here (denoiser.app.photo_time): '' without one."""
        sizes = self._sizes(model, upload)
        if sizes is None:
            return ""
        try:
            return f": **{self.engine.photo_time(model, *sizes[2:]).describe()} on this server**"
        except (ValueError, OSError, TypeError):
            return ""

    def prompt_box(self, model, operation):
        """The prompt box: shown for a text model's edit and inpaint; hidden and emptied otherwise (what runs then
        takes no prompt)."""
        if self.page.form.is_text(model) and takes_prompt(operation):
            return gr.update(visible=True)
        return gr.update(value="", visible=False)

    def prompt_cfg(self, model, class_name, prompt):
        """The guidance once a prompt is typed: the model's classifier-free scale for it (its plan's: its sampling.json's);
        without a prompt what cfg_default gives (a text model: 1, which an unconditioned run needs)."""
        if not (self.page.form.is_text(model) and str(prompt or "").strip()):
            return self.page.form.cfg_default(model, class_name)
        return gr.update(value=self.page.form.prompt_guidance(model, prompt), label="guidance (with a prompt)",
                         info="classifier-free guidance toward the prompt (the model's own scale); 1 = off")

    def prompt_changed(self, model, class_name, prompt, restored):
        """The guidance after the prompt box changed, however it changed (typed, pasted, filled in by a program,
        cleared): prompt_cfg's; untouched when "use these settings" filled the box (`restored`: the prompt it filled,
        whose result's guidance it also filled). Outputs: the guidance, `restored` used up."""
        if restored is not None and str(prompt or "") == restored:
            return gr.skip(), None
        return self.prompt_cfg(model, class_name, prompt), None

    def restore_form(self, gallery, selected, upload=None) -> tuple:
        """use_settings, and the prompt it filled (prompt_changed then keeps the result's guidance). Before any run, the
        uploaded picture's settings where it is a PNG this app wrote (a result dropped back in: A1111's "PNG Info")."""
        if not gallery and isinstance(upload, dict) and read_settings(upload.get("copy", "")):
            gallery = [(upload["copy"], "your upload")]
        *form, status = self.use_settings(gallery, selected)
        prompt = form[PHOTO_FORM.index("prompt")]
        return (*form, status, prompt["value"] if isinstance(prompt, dict) and "value" in prompt else gr.skip())

    def use_settings(self, gallery, selected) -> tuple:
        """The Photo tab's form refilled from the selected result's PNG (the result when "your image" is selected): PHOTO_FORM's
        fields (the class among its model's choices), and a status line saying so."""
        skip = (gr.skip(),) * len(PHOTO_FORM)
        items = list(gallery or [])
        if not items:
            return (*skip, "run first, or upload a PNG this app made: the settings are read from a result")
        chosen = items[min(int(selected or 0), len(items) - 1)]
        paths = [Path(str(i[0] if isinstance(i, (list, tuple)) else i)) for i in [chosen, *reversed(items)]]
        found = [(p, s) for p in paths if (s := read_settings(p))]
        if not found:
            return (*skip, "this result carries no settings")
        path, s = found[0]
        updates = {k: gr.update(value=s[k]) if k in s else gr.skip() for k in PHOTO_FORM}
        updates["class"] = self.page.form.class_choices(s.get("model"), s.get("class") or NO_CLASS)  # among its model's classes
        updates["prompt"] = gr.update(value=s.get("prompt", ""))  # none in the PNG: the run had no prompt
        # the file name as code: Markdown would turn its `_red_1.5_` into italics
        return (*updates.values(), f"settings of `{path.name}` restored: press Run")

"""The Sample tab: a model, its best settings and Generate; the results (PNGs that carry their settings, "download
all", "use these settings", the earlier results kept in the browser), the "try these" rows, and under the results a
text model's word edit (denoiser/app/word_edit.py). One module: its components (`SampleTab.build`), its handlers and
its wiring (`SampleTab.wire`); what a model's form shows is denoiser/app/form.py's, the generation's views the
Attention tab's (`AttentionTab.show`).
"""

from __future__ import annotations

import random

import gradio as gr

from denoiser.app.attention_tab import AttentionTab
from denoiser.app.controls import (
    CLEAR_TOASTS,
    JOB,
    form_slider,
    on_any_change,
    queued,
    run_controls,
    scroll_to_js,
    selected_index,
    stop_controls,
    whole_box,
)
from denoiser.app.earlier_results import KEEP, STORAGE_KEY, recall, remember
from denoiser.app.engine import APP_SCHEDULERS
from denoiser.app.form import (
    ADVANCED,
    MODELS_OWN,
    NO_CLASS,
    PROMPTS,
    SETTINGS_FORM,
    escape,
    few_steps_note,
    guidance_info,
)
from denoiser.app.form_limits import LIMITS
from denoiser.app.page import Page
from denoiser.app.result_files import result_files, results_zip
from denoiser.app.views import enlarge
from denoiser.app.word_edit import WordEdit
from denoiser.app.work_budget import plan_work
from denoiser.image_io import to_pil
from denoiser.request import BUILT_IN, TIMESTEP_SPACINGS

__all__ = ["SampleTab"]

# what a job of this tab runs with: one at a time on the server (the "sampling" slot), its queue place, progress and
# errors on the status line only (controls.JOB: a failed or stopped run leaves the pictures without "Error" badges)
SAMPLING = JOB


def _api_twin(name: str, control: gr.components.Component) -> gr.components.Component:
    """The /generate API's input for the form's `control` (SETTINGS_FORM's `name`), declared with the default None:
    Gradio declares a parameter's default from its component's first value, and the page's form starts at values a
    model then replaces, so a field an API caller leaves out is the model's own, as `denoiser sample` and the pipeline
    fill it (issue 59). The model is the page's first; the seed 0. A dropdown's twin takes any name: the handler
    refuses one the model lacks in a line of the log (Gradio's own check logged a traceback)."""
    if name == "model":
        return gr.Dropdown([value for _, value in control.choices], value=control.value, label=name,
                           allow_custom_value=True)
    if name == "seed":
        return gr.Number(0, precision=None, label=name)
    if isinstance(control, gr.Dropdown) and not control.allow_custom_value:
        return gr.Dropdown([value for _, value in control.choices], value=None, label=name, allow_custom_value=True)
    if isinstance(control, (gr.Number, gr.Slider)):
        return gr.Number(None, precision=None, label=name)
    return gr.Textbox(None, label=name)


class SampleTab:
    """The Sample tab of one page."""

    def __init__(self, page: Page) -> None:
        self.page, self.engine, self.jobs = page, page.engine, page.jobs
        self.word_edit = WordEdit(page, self)

    def build(self) -> None:
        form, models, default = self.page.form, self.page.models, self.page.default_model
        first = [m for m in sorted(models, key=lambda m: m != default) if form.loads(m)][:3]  # the default model first
        rows = [form.example_row(m, k) for k, m in enumerate(first)]  # "try these": everything set, a class or prompt
        self.selected = gr.State(0)  # the result selected in the gallery
        self.earlier_selected = gr.State(0)  # ... and in the earlier results
        self.kept = gr.BrowserState([], storage_key=STORAGE_KEY)  # denoiser.app.earlier_results
        with gr.Tab("Sample"):
            with gr.Row():
                # first (left; on a phone, on top): Generate, Stop, the progress and the live preview stay together
                with gr.Column(scale=2, elem_id="sample-main"):
                    self.run, self.stop, self.status = run_controls("Generate", "generate", "stop", "status")
                    self.preview = gr.Image(label="denoising: the predicted clean image (x₀) so far", format="png",
                                            type="pil", interactive=False, elem_id="preview", height=280)
                    self.gallery = gr.Gallery(label="results (lossless PNG, named after and carrying their settings)",
                                              format="png", columns=4, elem_id="gallery", buttons=["download", "fullscreen"],
                                              height="auto", object_fit="contain", type="filepath", interactive=False)
                    # every result in one zip named after the run (results_zip), shown once there are results
                    self.download_all = gr.DownloadButton("download all", size="sm", elem_id="download-all", visible=False)
                    self.use_selected = gr.Button("use these settings (the selected result's)", size="sm",
                                                  elem_id="use-settings")
                    # A1111's "PNG Info": a PNG this app wrote, dropped here, fills the form with what made it
                    self.settings_png = gr.File(label="or drop a PNG this app made: its settings fill the form",
                                                file_types=[".png"], type="filepath", elem_id="settings-png", height=90)
                    self.word_edit.build()  # a text model's result: change its words, keep the picture
                    # this browser's last results (denoiser.app.earlier_results): shown once there are any, after a
                    # reload too
                    self.earlier = gr.Gallery(label=f"earlier results (the last {KEEP}, kept in this browser)",
                                              format="png", columns=6, elem_id="earlier", buttons=["download"], height=240,
                                              visible=False, object_fit="contain", type="filepath", interactive=False)
                    self.use_earlier = gr.Button("use these settings (the selected earlier result's)", size="sm",
                                                 elem_id="use-earlier", visible=False)
                with gr.Column(scale=1, elem_id="sample-settings"):
                    self._settings(models, default, rows)
            # full width, under both columns: a click sets everything (a class included) and generates (wire)
            example_inputs = [self.model, self.scheduler, self.steps, self.seed, self.num_images, self.class_name,
                              self.guidance, self.pag, self.guide_w, self.prompt]
            self.examples = gr.Examples(rows, example_inputs, label="try these", elem_id="try-these") if rows else None
            if self.examples is not None:  # the table's headers: the sliders' names, "guidance" for a class or a prompt
                self.examples.dataset.headers = [
                    "guidance" if comp is self.guidance else str(comp.label) for comp in example_inputs]

    def _settings(self, models: list[str], default: str | None, rows: list[list]) -> None:
        """The form's column: the model, the sampler, the class or prompt, the guidance, the advanced settings."""
        self.model = gr.Dropdown(models, value=default, label="model", info="each is a trained model folder (weights/)",
                                 elem_id="model")
        self.scheduler = gr.Dropdown(list(APP_SCHEDULERS), value=BUILT_IN["scheduler"], label="scheduler", elem_id="scheduler")
        with gr.Row():
            self.steps = whole_box("steps", BUILT_IN["steps"], "steps", "steps",
                                   "set to the model's best when you pick it; under 10 leave noise")
            self.num_images = whole_box("num_images", BUILT_IN["num_images"], "images", "num-images")
        with gr.Row():
            self.seed = whole_box("seed", 0, "seed", "seed")
            self.randomise = gr.Button("random seed", size="sm")
        self.budget = gr.Markdown(elem_id="budget")  # this request's work against the server's budget
        # a text model's prompt in place of the class (ModelForm.text_controls shows one or the other)
        self.prompt = gr.Textbox("", label="prompt", elem_id="prompt", visible=False, max_lines=2,
                                 placeholder="what to draw, e.g. red apple; empty: anything (no condition)",
                                 info="a text model sees each word as one token (the Attention tab shows each word's map)")
        with gr.Column(visible=False, min_width=0, elem_id="prompt-examples") as self.prompt_examples_box:
            self.prompt_examples = gr.Examples([[p] for p in PROMPTS], [self.prompt], label="example prompts",
                                               examples_per_page=len(PROMPTS))  # the model's: text_controls
        # custom values allowed: choices follow the chosen model; generate() validates them; the rows' classes among
        # the first choices, so that the "try these" table shows them
        with gr.Column(min_width=0, elem_id="class-box"):  # its own block: on a phone it moves under Generate
            self.class_name = gr.Dropdown(list(dict.fromkeys([NO_CLASS] + [r[5] for r in rows])), value=NO_CLASS,
                                          label="class", visible=False, elem_id="class", allow_custom_value=True)
        self.guidance = form_slider(*LIMITS["guidance_scale"], value=1.0, step=0.5, label="guidance (with a class)",
                                    elem_id="cfg", info=guidance_info())
        self.pag = form_slider(*LIMITS["pag_scale"], value=0.0, step=0.25, label="attention guidance (PAG)", elem_id="pag",
                               info="steer away from the U-Net with its low-resolution decoder attention switched to "
                                    "identity: sharper structure, no class needed; 0 = off, one extra pass")
        self.guide_w = form_slider(*LIMITS["guide_scale"], value=1.0, step=0.25, label="autoguidance", visible=False,
                                   elem_id="autoguidance", info="steer away from the model's small, less-trained guide "
                                                                "model; 1 = off")
        # folded away: the model folder's own values unless changed (denoiser.sampling.plan.resolve)
        with gr.Accordion("advanced", open=False, elem_id="advanced"):
            self.spacing = gr.Dropdown([MODELS_OWN, *TIMESTEP_SPACINGS], value=MODELS_OWN, label="timestep spacing",
                                       elem_id="spacing", info="which timesteps the steps visit; trailing starts at "
                                                               "pure noise (what few-step DDIM needs)")
            self.eta = form_slider(0, 1, value=0.0, step=0.05, label="fresh noise per step (DDIM eta)", elem_id="eta",
                                   info="fresh noise at each DDIM step; 0 = deterministic")
            self.interval = gr.Textbox("", label="guidance interval: timesteps lo, hi", elem_id="interval",
                                       placeholder="e.g. 70, 550; empty: the model's (or every step)")
            self.negative_prompt = gr.Textbox("", label="negative prompt", elem_id="negative-prompt", visible=False,
                                              max_lines=2, placeholder="empty: no condition",
                                              info="what guidance steers away from (a text model, guidance above 1)")
            self.pag_layers = gr.Textbox("", label="attention guidance (PAG) layers", elem_id="pag-layers",
                                         placeholder="comma-separated, as the Heads tab names them (e.g. mid_attn); "
                                                     "empty: the low-resolution decoder attention")

    @property
    def form(self) -> list:
        """The form's controls in SETTINGS_FORM's order: Generate reads them, "use these settings" fills them."""
        return [self.model, self.scheduler, self.steps, self.seed, self.num_images, self.class_name, self.guidance,
                self.pag, self.guide_w, self.spacing, self.eta, self.interval, self.pag_layers, self.prompt,
                self.negative_prompt]

    @property
    def outputs(self) -> list:
        """What a sampling job of this tab sets (Generate, the word edit): the preview, the results, the generation
        and its views (the Attention tab's), the status line. The /generate API returns them in this order."""
        return [self.preview, self.gallery, *self.page.tab(AttentionTab).generation_outputs, self.status]

    def wire(self, app: gr.Blocks) -> None:
        form = self.page.form
        # each job's click noted first, unqueued: its queue place on the status line, and a Stop while it waits
        for button in (self.run, self.word_edit.run):
            queued(button, self.status, self.jobs)
        # the model's best on load and when a person picks a model or a class (.input); a form filled by "use these
        # settings" or a "try these" row keeps what it was given, and sets the class choices of its model itself (a
        # .change of the model would race it: it reads the class shown before the row's arrived)
        model_form = [self.class_name, self.guidance, self.scheduler, self.steps, self.pag, self.guide_w]
        # (unqueued, as the model's own .change: a queued load came seconds late on a busy server and set back a model
        # picked before it)
        app.load(form.model_form, [self.model, self.class_name], model_form, api_name=False, queue=False)
        # a text model's prompt in place of the class: shown with its model, however the model was set
        text_controls = [self.prompt, self.negative_prompt, self.prompt_examples_box, self.prompt_examples.dataset]
        app.load(form.text_controls, self.model, text_controls, api_name=False, queue=False)
        self.model.change(form.text_controls, self.model, text_controls, api_name=False, queue=False,
                          show_progress="hidden")
        # Gradio's Examples (6.31) set each input's props as built with the value clicked: the prompt box, built
        # hidden, would hide (and a row's class selector: filled_form shows it)
        for clicked in (self.prompt_examples.load_input_event, *([self.examples.load_input_event] if self.examples else [])):
            clicked.then(form.text_controls, self.model, text_controls, api_name=False, queue=False,
                         show_progress="hidden")
        self.model.input(form.model_form, [self.model, self.class_name], model_form, api_name=False)
        self.class_name.input(form.cfg_default, [self.model, self.class_name], self.guidance, api_name=False)
        work = [self.model, self.steps, self.num_images, self.class_name, self.guidance, self.pag, self.guide_w,
                self.scheduler, self.spacing, self.interval, self.pag_layers, self.prompt,
                self.negative_prompt]  # what Generate reads, in budget_note's order
        on_any_change(work, form.budget_note, work, self.budget, load=app, show_progress="hidden")  # the latest form's
        self.gallery.select(selected_index, None, self.selected, api_name=False)
        self.randomise.click(lambda: random.randint(0, 2**31 - 1), None, self.seed, api_name=False)
        sampling = SAMPLING
        # typed: a number box left empty is refused. An input, not functools.partial: Gradio (6.31) reads a handler's
        # type hints to pass it the gr.Request, and a partial has none, so the job knew no session and Stop missed it
        typed = gr.State(True)
        generating = self.run.click(self.generate, [*self.form, typed], self.outputs, api_name=False, **sampling)
        with gr.Row(visible=False):  # the /generate API: the form's twins, each left unset the model's own
            api_form = [_api_twin(name, control) for name, control in zip(SETTINGS_FORM, self.form)]
            api_door = gr.Button()
        api_door.click(self.generate, api_form, self.outputs, api_name="generate", **sampling)
        runs = [generating, self.word_edit.wire(sampling)]  # a text model's result, its words changed
        # "use these settings" fills the form, and from a word edit's result the word edit's panel
        restored = [*self.form, *self.word_edit.panel, self.status]
        self.use_selected.click(self.word_edit.use_settings, [self.gallery, self.selected], restored, api_name=False)
        self.settings_png.upload(self.word_edit.settings_of_file, self.settings_png, restored, api_name=False,
                                 queue=False)
        if self.examples is not None:  # a "try these" row fills the form, then generates as Generate does
            filled = self.examples.load_input_event
            # the row's table is below: the status line and the preview come into view; older messages close
            filled.then(None, js=f"() => {{ {CLEAR_TOASTS} ({scroll_to_js(self.run.elem_id)})(); }}")
            advanced = [dict(zip(SETTINGS_FORM, self.form))[name] for name in ADVANCED]  # the form's controls, by name
            row = filled.then(form.filled_form, [self.model, self.class_name], [self.class_name, self.guidance, *advanced],
                              api_name=False, queue=False)
            noted = queued(row, self.status, self.jobs)  # noted as Generate's click is: its queue place, a Stop
            runs.append(noted.then(self.generate, self.form, self.outputs, api_name=False, **sampling))
        # a finished run's results join the ones kept in the browser; a reload shows those again
        earlier = [self.earlier, self.use_earlier]
        for run in runs:
            run.success(self.keep_results, [self.gallery, self.kept], [self.kept, *earlier], api_name=False, queue=False)
            run.success(results_zip, self.gallery, self.download_all, api_name=False, queue=False)
        app.load(self.kept_results, self.kept, earlier, api_name=False)
        self.earlier.select(selected_index, None, self.earlier_selected, api_name=False)
        self.use_earlier.click(self.word_edit.use_settings, [self.earlier, self.earlier_selected], restored,
                               api_name=False)
        # Stop: the session's job stops after the UNet call in progress and says where it stopped and what the pictures
        # shown are (denoiser.app.jobs)
        stop_controls(self.stop, self.status, self.jobs)

    def generate(self, model, scheduler=None, steps=None, seed=0, num_images=None, class_name=None, guidance_scale=None,
                 pag_scale=None, guide_scale=None, timestep_spacing=None, eta=None, guidance_interval=None, pag_layers=None,
                 prompt=None, negative_prompt=None, typed=False, progress=gr.Progress(), request: gr.Request = None):
        """Generate, and the /generate API's: the form read as one SampleRequest (ModelForm.request: a field None is the
        model's own, as `denoiser sample` leaves a flag not given; the page sends its whole form, set to the model's
        values when it was picked), resolved once into the plan the job runs; `typed`: the page's Generate, where a
        number box a person emptied is refused. Yields updates keyed by `outputs`' components."""
        try:  # the request checked and resolved once, before any work: a refusal is a message, not a failure
            # `sample`, not `request`: that name is the page's gr.Request, which says whose job this is
            sample = self.page.form.request(model, scheduler, steps, seed, num_images, class_name, guidance_scale,
                                            pag_scale, guide_scale, timestep_spacing, eta, guidance_interval, pag_layers,
                                            prompt, negative_prompt, typed=typed)
            plan = self.engine.plan(model, sample)  # resolved once: the job below runs this plan
            plan_work(plan).check()
        except Exception as err:  # noqa: BLE001 - said on the status line, then raised (the toast; an API caller's)
            yield from self.jobs.refuse(request, self.status, err)

        def job(on_step):
            return self.engine.generate(model, sample, plan=plan, on_step=on_step)

        gen = yield from self.jobs.run(request, self.status, job, progress, "denoising", self.preview, enlarge)
        if gen is None:  # stopped: its line says where
            return
        # what ran: the plan's values (an API call's unset fields are the model's own)
        has_class = plan.labels is not None
        settings = dict(model=model, seed=plan.seed, scheduler=plan.scheduler_name, steps=plan.steps,
                        num_images=plan.num_images, guidance_scale=plan.guidance.scale, pag_scale=plan.guidance.pag_scale,
                        guide_scale=plan.guidance.guide_scale, precision=gen.precision,
                        **{"class": class_name if has_class else None})
        advanced = dict(timestep_spacing=timestep_spacing or MODELS_OWN, eta=float(eta or 0),
                        guidance_interval=guidance_interval or "", pag_layers=pag_layers or "",
                        prompt=sample.prompts or "", negative_prompt=sample.negative_prompts or "")
        settings.update({k: v for k, v in advanced.items() if v != SETTINGS_FORM[k]})  # only those changed
        of = f" of “{escape(gen.prompt)}”" if gen.prompt else (f" of class {escape(class_name)}" if has_class else "")
        cut = "".join(f" · **{escape(note)}**" for note in gen.notes)  # a cut prompt, words the model never saw
        yield self.jobs.done(request, self.status, {
            self.preview: enlarge(to_pil(gen.images)), self.gallery: result_files(gen.images, settings),
            **self.page.tab(AttentionTab).show(gen),
            self.status: f"done: {gen.images.shape[0]} image(s){of}, {gen.num_steps} steps, {gen.precision}" + cut
            + few_steps_note(gen.num_steps)})

    @staticmethod
    def keep_results(gallery, kept) -> tuple:
        """A finished run's results added to the ones kept in the browser (denoiser.app.earlier_results); the earlier
        results shown are those before them (the gallery above already shows the new ones)."""
        earlier = [k for k in (kept or []) if isinstance(k, dict)]
        return (remember(gallery, kept), *SampleTab.kept_results(earlier))

    @staticmethod
    def kept_results(kept) -> tuple:
        """The earlier-results gallery and its button: the kept results, shown once there are any."""
        files = recall(kept)
        return gr.update(value=files, visible=bool(files)), gr.update(visible=bool(files))

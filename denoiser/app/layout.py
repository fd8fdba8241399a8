"""The web app's page: four tabs of components (Sample, Photo, Attention, Heads) and the events that bind them
to the handlers (denoiser/app/handlers.py). Declarative: no logic beyond which handler serves which event.
"""

from __future__ import annotations

import random
from types import SimpleNamespace

import gradio as gr

from denoiser.app.attention_tab import AttentionTab
from denoiser.app.cache_sweep import sweep_safe, whole_files
from denoiser.app.controls import (
    CANCELS_JS,
    CLEAR_TOASTS,
    SESSION_TTL_S,
    form_slider,
    keep,
    on_any_change,
    ran_js,
    retry_js,
    run_controls,
    stop_controls,
    whole_box,
)
from denoiser.app.earlier_results import KEEP, STORAGE_KEY
from denoiser.app.engine import SCHEDULERS, Engine
from denoiser.app.form import ADVANCED, SETTINGS_FORM
from denoiser.app.form_limits import LIMITS
from denoiser.app.handlers import MODELS_OWN, NO_CLASS, PROMPTS, Handlers, guidance_info, results_zip
from denoiser.app.heads_tab import HeadsTab
from denoiser.app.photo_tab import EXAMPLES, edit_tab, wire_edit
from denoiser.app.word_edit import wire_word_edit, word_edit_box
from denoiser.request import BUILT_IN, TIMESTEP_SPACINGS

__all__ = ["build_app", "LAUNCH"]

# a model's images are 16-64 pixels: enlarged in the galleries, each pixel stays a sharp square
# every failure reaches the page as a toast that stays (streaming.user_error) and the status lines say in words what
# happened (a refusal, a stop); Gradio's red "Error" pill, drawn over each output of a failed event, would repeat it
# over pictures and text that are still true (the ones from before), so it is not drawn
# on a phone the Sample tab's two columns stack: Generate and its status first, the prompt (or class) right under
# them, then the live preview, the model and the other settings, then the results (both columns are dissolved into
# the row so their pieces can take that order); the "try these" table keeps its model, steps, class, guidance and
# prompt columns, so that it fits the width (a click still sets everything, and the form shows it)
CSS = ("#gallery img, #earlier img, #edit-result img, #preview img, #edit-preview img { image-rendering: pixelated; }\n"
       "[data-testid=status-tracker] .error { display: none; }\n"
       "@media (max-width: 700px) { #sample-main, #sample-settings { display: contents; }\n"
       "  #sample-main > *, #sample-settings > * { flex: 1 1 100%; min-width: 0; }\n"
       "  #preview, #sample-settings > * { order: 1; }\n"
       "  #sample-settings > :has(#prompt), #sample-settings > #prompt-examples, #sample-settings > #class-box { order: 0; }\n"
       "  #gallery, #download-all, #use-settings, #settings-png, #word-edit, #earlier, #use-earlier { order: 2; }\n"
       "  #try-these :is(th, td):is(:nth-child(2), :nth-child(4), :nth-child(5), :nth-child(8), :nth-child(9))\n"
       "  { display: none; } #try-these table { width: 100%; table-layout: fixed; }\n"
       "  #try-these :is(th, td) { padding: 2px; font-size: 13px; white-space: normal; overflow-wrap: anywhere; }\n"
       # a chart shrunk to a phone's width: its label above it, not over its first row of names
       "  :is(#word-maps, #word-weights) [data-testid=block-label] { position: static; } }")
# a "try these" row (or the word edit under the results) was clicked far below: bring Generate's status line and live
# preview into view
SHOW_RUN = ("() => { document.querySelector('#generate').scrollIntoView({block: 'start', behavior: 'instant'}); "
            "window.scrollBy(0, -24); }")
# launch() settings every server of this app uses: uploads (a photo on the Photo tab) of at most 25 MB, what a
# phone or camera writes; image_io then refuses more than 50 megapixels before decoding
# show_error: Gradio's own input validation (e.g. a raw API call with steps: null) reaches the client as its
# message instead of "the upstream app has raised an exception"; our handlers' errors are already short
# and escaped (streaming.user_error), so no traceback or server path is shown either way
# state_session_capacity: the sessions whose generations stay in memory (oldest dropped first; app.py's
# --max-sessions); with the work budget, one generation holds at most ~200 MB of step inputs (the 16x16 model: 64 images x 1000 steps)
LAUNCH = {"max_file_size": "25mb", "show_error": True, "state_session_capacity": 32, "css": CSS, "js": CANCELS_JS}


def build_app(engine: Engine) -> gr.Blocks:
    h = Handlers(engine)
    models = engine.models()
    preferred = [m for m in ("cifar10", "synthetic-shapes") if m in models]
    default = preferred[0] if preferred else (models[0] if models else None)
    # the example pictures are served from the package, never copied into the cache the sweep below empties
    gr.set_static_paths([EXAMPLES])
    with gr.Blocks(title="denoiser", delete_cache=(300, 900), analytics_enabled=False) as app:
        c = SimpleNamespace(gen_state=gr.State(None, time_to_live=SESSION_TTL_S),
                            pixel_state=gr.State(None, time_to_live=SESSION_TTL_S),
                            photo_shown=gr.State(None),  # the upload the Photo tab's editor holds
                            selected=gr.State(0),  # the result selected in the Sample tab's gallery
                            earlier_selected=gr.State(0),  # ... and in its earlier results
                            kept=gr.BrowserState([], storage_key=STORAGE_KEY))  # denoiser.app.earlier_results
        gr.Markdown("# denoiser — attention U-Net diffusion\nGenerate on the **Sample** tab, or denoise, edit and inpaint "
                    "your own photo on the **Photo** tab; then click any pixel on the **Attention** tab to see where each "
                    "attention layer of the U-Net looks; the **Heads** tab measures what each layer and head does and "
                    "switches them off.")
        _sample_tab(c, h, models, default)
        edit_tab(c, models, default)
        c.attention = AttentionTab(engine, h.jobs)
        c.attention.build()
        heads = HeadsTab(engine, h.jobs)
        heads.build()
        _wire(app, h, c)
        c.attention.wire(c.gen_state, c.pixel_state)
        heads.wire(c.gen_state, c.attention.image_idx)
    whole_files()  # a picture returned again is not rewritten under a response still serving it
    return sweep_safe(app)  # the delete_cache sweep above survives files added while it runs


def _sample_tab(c: SimpleNamespace, h: Handlers, models: list[str], default: str | None) -> None:
    first = [m for m in sorted(models, key=lambda m: m != default) if h.form.loads(m)][:3]  # the default model first
    rows = [h.form.example_row(m, k) for k, m in enumerate(first)]  # "try these": everything set, a class or prompt included
    with gr.Tab("Sample"):
        with gr.Row():
            # first (left; on a phone, on top): Generate, Stop, the progress and the live preview stay together
            with gr.Column(scale=2, elem_id="sample-main"):
                run, stop, status = run_controls("Generate", "generate", "stop", "status")
                preview = gr.Image(label="denoising: the predicted clean image (x₀) so far", format="png", type="pil", interactive=False,
                                   elem_id="preview", height=280)
                gallery = gr.Gallery(label="results (lossless PNG, named after and carrying their settings)", format="png",
                                     columns=4, elem_id="gallery", buttons=["download", "fullscreen"], height="auto",
                                     object_fit="contain", type="filepath", interactive=False)
                # every result in one zip named after the run (handlers.results_zip), shown once there are results
                c.download_all = gr.DownloadButton("download all", size="sm", elem_id="download-all", visible=False)
                use_settings = gr.Button("use these settings (the selected result's)", size="sm", elem_id="use-settings")
                # A1111's "PNG Info": a PNG this app wrote, dropped here, fills the form with what made it
                settings_png = gr.File(label="or drop a PNG this app made: its settings fill the form", file_types=[".png"],
                                       type="filepath", elem_id="settings-png", height=90)
                word_edit_box(c)  # a text model's result: change its words, keep the picture (denoiser.app.word_edit)
                # this browser's last results (denoiser.app.earlier_results): shown once there are any, after a reload too
                earlier = gr.Gallery(label=f"earlier results (the last {KEEP}, kept in this browser)", format="png",
                                     columns=6, elem_id="earlier", buttons=["download"], height=240, visible=False,
                                     object_fit="contain", type="filepath", interactive=False)
                use_earlier = gr.Button("use these settings (the selected earlier result's)", size="sm",
                                        elem_id="use-earlier", visible=False)
            with gr.Column(scale=1, elem_id="sample-settings"):
                model = gr.Dropdown(models, value=default, label="model", info="each is a trained model folder (weights/)",
                                    elem_id="model")
                scheduler = gr.Dropdown(list(SCHEDULERS), value=BUILT_IN["scheduler"], label="scheduler", elem_id="scheduler")
                with gr.Row():
                    steps = whole_box("steps", BUILT_IN["steps"], "steps", "steps",
                                      "set to the model's best when you pick it; under 10 leave noise")
                    num_images = whole_box("num_images", BUILT_IN["num_images"], "images", "num-images")
                with gr.Row():
                    seed = whole_box("seed", 0, "seed", "seed")
                    randomise = gr.Button("🎲 randomise", size="sm")
                budget = gr.Markdown(elem_id="budget")  # this request's work against the server's budget
                # a text model's prompt in place of the class (handlers.text_controls shows one or the other)
                prompt = gr.Textbox("", label="prompt", elem_id="prompt", visible=False, max_lines=2,
                                    placeholder="what to draw, e.g. red apple; empty: anything (no condition)",
                                    info="a text model sees each word as one token (the Attention tab shows each word's map)")
                with gr.Column(visible=False, min_width=0, elem_id="prompt-examples") as prompt_examples_box:
                    c.prompt_examples = gr.Examples([[p] for p in PROMPTS], [prompt], label="example prompts",
                                                    examples_per_page=len(PROMPTS))  # the model's: text_controls
                # custom values allowed: choices follow the chosen model; generate() validates them
                # the rows' classes among the first choices, so that the "try these" table shows them
                with gr.Column(min_width=0, elem_id="class-box"):  # its own block: on a phone it moves under Generate
                    class_name = gr.Dropdown(list(dict.fromkeys([NO_CLASS] + [r[5] for r in rows])), value=NO_CLASS,
                                             label="class", visible=False, elem_id="class", allow_custom_value=True)
                guidance = form_slider(*LIMITS["guidance_scale"], value=1.0, step=0.5, label="guidance (with a class)", elem_id="cfg",
                                     info=guidance_info())
                pag = form_slider(*LIMITS["pag_scale"], value=0.0, step=0.25, label="attention guidance (PAG)", elem_id="pag",
                                info="steer away from the U-Net with its low-resolution decoder attention switched to identity: "
                                     "sharper structure, no class needed; 0 = off, one extra pass")
                guide_w = form_slider(*LIMITS["guide_scale"], value=1.0, step=0.25, label="autoguidance", visible=False,
                                    elem_id="autoguidance",
                                    info="steer away from the model's small, less-trained guide model; 1 = off")
                # folded away: the model folder's own values unless changed (denoiser.sampling.plan.resolve)
                with gr.Accordion("advanced", open=False, elem_id="advanced"):
                    spacing = gr.Dropdown([MODELS_OWN, *TIMESTEP_SPACINGS], value=MODELS_OWN, label="timestep spacing",
                                          elem_id="spacing", info="which timesteps the steps visit; trailing starts at "
                                                                  "pure noise (what few-step DDIM needs)")
                    eta = form_slider(0, 1, value=0.0, step=0.05, label="fresh noise per step (DDIM eta)", elem_id="eta",
                                    info="fresh noise at each DDIM step; 0 = deterministic")
                    interval = gr.Textbox("", label="guidance interval: timesteps lo, hi", elem_id="interval",
                                          placeholder="e.g. 70, 550; empty: the model's (or every step)")
                    negative_prompt = gr.Textbox("", label="negative prompt", elem_id="negative-prompt", visible=False,
                                                 max_lines=2, placeholder="empty: no condition",
                                                 info="what guidance steers away from (a text model, guidance above 1)")
                    pag_layers = gr.Textbox("", label="attention guidance (PAG) layers", elem_id="pag-layers",
                                            placeholder="comma-separated, as the Heads tab names them (e.g. mid_attn); "
                                                        "empty: the low-resolution decoder attention")
        # full width, under both columns: a click sets everything (a class included) and generates (_wire)
        example_inputs = [model, scheduler, steps, seed, num_images, class_name, guidance, pag, guide_w, prompt]
        c.sample_examples = gr.Examples(rows, example_inputs, label="try these", elem_id="try-these") if rows else None
        if c.sample_examples is not None:  # the table's headers: the sliders' names, "guidance" for a class or a prompt
            c.sample_examples.dataset.headers = [
                "guidance" if comp is guidance else str(comp.label) for comp in example_inputs]
    keep(c, locals())


def _wire(app: gr.Blocks, h: Handlers, c: SimpleNamespace) -> None:
    """Which handler serves which event."""
    # before the jobs they retry: Gradio runs a click's listeners in order, each job's to its end (retry_js)
    for button in (c.run, c.word_edit_run, c.edit_run):
        button.click(None, js=retry_js(button.elem_id), api_name=False, queue=False)
    # each job's request noted at once, unqueued: a Stop while it still waits in the queue says it never started
    for button, line in ((c.run, c.status), (c.word_edit_run, c.status), (c.edit_run, c.edit_status)):
        button.click(h.jobs.requester(line.elem_id), None, None, api_name=False, queue=False)
    # the model's best on load and when a person picks a model or a class (.input); a form filled by "use these
    # settings" or a "try these" row keeps what it was given, and sets the class choices of its model itself (a
    # .change of the model would race it: it reads the class shown before the row's arrived)
    model_form = [c.class_name, c.guidance, c.scheduler, c.steps, c.pag, c.guide_w]
    app.load(h.form.model_form, [c.model, c.class_name], model_form, api_name=False)
    # a text model's prompt in place of the class: shown with its model, however the model was set
    text_controls = [c.prompt, c.negative_prompt, c.prompt_examples_box, c.prompt_examples.dataset]
    app.load(h.form.text_controls, c.model, text_controls, api_name=False)
    c.model.change(h.form.text_controls, c.model, text_controls, api_name=False, queue=False, show_progress="hidden")
    # Gradio's Examples (6.31) set each input's props as built with the value clicked: the prompt box, built hidden,
    # would hide (and a row's class selector: filled_form shows it)
    for clicked in (c.prompt_examples.load_input_event, *([c.sample_examples.load_input_event] if c.sample_examples else [])):
        clicked.then(h.form.text_controls, c.model, text_controls, api_name=False, queue=False, show_progress="hidden")
    c.model.input(h.form.model_form, [c.model, c.class_name], model_form, api_name=False)
    c.class_name.input(h.form.cfg_default, [c.model, c.class_name], c.guidance, api_name=False)
    work = [c.model, c.steps, c.num_images, c.class_name, c.guidance, c.pag, c.guide_w, c.scheduler, c.spacing, c.interval,
            c.pag_layers, c.prompt, c.negative_prompt]  # what Generate reads, in budget_note's order
    on_any_change(work, h.form.budget_note, work, c.budget, load=app, show_progress="hidden")  # the note of the latest form
    c.gallery.select(h.select_result, None, c.selected, api_name=False)
    # the Sample tab's form, in SETTINGS_FORM's order: Generate reads it, "use these settings" fills it
    form = [c.model, c.scheduler, c.steps, c.seed, c.num_images, c.class_name, c.guidance, c.pag, c.guide_w, c.spacing,
            c.eta, c.interval, c.pag_layers, c.prompt, c.negative_prompt]
    c.randomise.click(lambda: random.randint(0, 2**31 - 1), None, c.seed, api_name=False)
    # a new generation: no pixel, no maps of the old one; its prompt's words (if any), no word chosen
    cleared = [c.pixel_state, *c.attention.cleared_by_generation]
    sample_inputs = form
    sample_outputs = [c.preview, c.gallery, c.gen_state, *c.attention.shown_for_generation, *cleared, c.status]
    # progress and errors show on the status line only: a failed or stopped run leaves the pictures shown without
    # "Error" badges over them (the error's message stays until closed: streaming.user_error)
    sampling = dict(concurrency_limit=1, concurrency_id="sampling", show_progress_on=[c.status])
    generating = c.run.click(h.generate, sample_inputs, sample_outputs, api_name=False, js=ran_js("generate"),
                             **sampling)
    # the /generate API: its own inputs, each declared with the default None (the page's form starts at values a
    # model then replaces, and Gradio declares a parameter's default from its component's first value), so a field
    # an API caller leaves out is the model's own, as `denoiser sample` and the pipeline fill it (issue 59)
    with gr.Row(visible=False):
        api_form = [gr.Dropdown([value for _, value in c.model.choices], value=c.model.value, label="model"),
                    gr.Dropdown(list(SCHEDULERS), value=None, label="scheduler"),
                    gr.Number(None, precision=None, label="steps"), gr.Number(0, precision=None, label="seed"),
                    gr.Number(None, precision=None, label="num_images"),
                    gr.Textbox(None, label="class"),
                    *(gr.Number(None, label=name) for name in ("guidance_scale", "pag_scale", "guide_scale")),
                    gr.Dropdown(list(TIMESTEP_SPACINGS), value=None, label="timestep_spacing"),
                    gr.Number(None, label="eta"),
                    *(gr.Textbox(None, label=name) for name in ("guidance_interval", "pag_layers", "prompt",
                                                                "negative_prompt"))]
        api_door = gr.Button()
    api_door.click(h.generate, api_form, sample_outputs, api_name="generate", **sampling)
    word_editing, w = wire_word_edit(app, h, c, sample_outputs, form, sampling)  # a text model's result, words changed
    c.word_edit_run.click(None, js=SHOW_RUN, api_name=False)  # its progress and pictures show where Generate's do
    runs = [generating, word_editing]
    # "use these settings" fills the form, and from a word edit's result the word edit's panel
    restored = [*form, c.edit_words, c.edit_type, c.cross_replace, c.self_replace, c.word_filled_from, c.status]
    c.use_settings.click(w.use_settings, [c.gallery, c.selected], restored, api_name=False)
    c.settings_png.upload(w.settings_of_file, c.settings_png, restored, api_name=False, queue=False)
    if c.sample_examples is not None:  # a "try these" row fills the form, then generates as Generate does
        filled = c.sample_examples.load_input_event
        # the row's table is below: the status line and the preview come into view; older messages close
        filled.then(None, js=f"() => {{ {CLEAR_TOASTS} ({SHOW_RUN})(); }}")
        advanced = [dict(zip(SETTINGS_FORM, form))[name] for name in ADVANCED]  # the form's controls, by name
        runs.append(filled.then(h.form.filled_form, [c.model, c.class_name], [c.class_name, c.guidance, *advanced],
                                api_name=False, queue=False)
                    .then(h.generate, sample_inputs, sample_outputs, api_name=False, **sampling))
    # a finished run's results join the ones kept in the browser; a reload shows those again
    earlier = [c.earlier, c.use_earlier]
    for run in runs:
        run.success(h.keep_results, [c.gallery, c.kept], [c.kept, *earlier], api_name=False, queue=False)
        run.success(results_zip, c.gallery, c.download_all, api_name=False, queue=False)
    app.load(h.kept_results, c.kept, earlier, api_name=False)
    c.earlier.select(h.select_result, None, c.earlier_selected, api_name=False)
    c.use_earlier.click(w.use_settings, [c.earlier, c.earlier_selected], restored, api_name=False)
    editing = wire_edit(app, h, c, cleared)  # the Photo tab's Run (its Stop below cancels it)
    # Stop: Gradio closes the running handler at its next yield (at most HEARTBEAT_S), streaming.stream then stops the
    # worker after the UNet call in progress and frees the sampling slot
    # the status line then says where it stopped and what the pictures shown are
    # (after the cancel has landed: that update also clears the cancelled run's error state from the status line)
    for button, line, jobs in ((c.stop, c.status, runs), (c.edit_stop, c.edit_status, [editing])):
        stop_controls(button, line, jobs, h.jobs)

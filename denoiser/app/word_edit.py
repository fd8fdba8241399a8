"""The Sample tab's word edit: "change the words, keep the picture" on a text model's result (prompt-to-prompt,
Hertz et al. 2022: denoiser.sampling.prompt_to_prompt).

The selected result is drawn again from its own noise beside its edit, in one batch: image 0 with the result's
prompt (the source), image 1 with the edited prompt, for the first part of the steps taking the source's word maps
(cross-attention) and its layout (self-attention). What it starts from is the result's PNG: its settings, and the
seed of its noise (a plain result's image k is seed + k; both pictures of a word edit are its source's seed). The
request is the Sample tab's own (a SampleRequest with a PromptEdit, Engine.generate): the same queue, work budget, progress and Stop
as Generate. Its PNGs carry the source prompt, the edited prompt, the edit type and the two fractions, and "use
these settings" fills the form and this panel from them.

One class, `WordEdit`: its components (`build`, inside the Sample tab's results column), its handlers and its wiring
(`wire`); the tab around it is denoiser/app/sample_tab.py.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import gradio as gr

from denoiser.app.attention_tab import AttentionTab
from denoiser.app.controls import form_slider, scroll_to_js
from denoiser.app.engine import check_prompt
from denoiser.app.form import NO_CLASS, SETTINGS_FORM, escape, few_steps_note
from denoiser.app.page import Page
from denoiser.app.png_settings import dropped_settings, read_settings
from denoiser.app.result_files import result_files
from denoiser.app.views import enlarge
from denoiser.app.work_budget import plan_work
from denoiser.image_io import to_pil
from denoiser.request import DEFAULT_CROSS_REPLACE, DEFAULT_SELF_REPLACE, PromptEdit, SampleRequest

__all__ = ["EDIT_SETTINGS", "OFFERED", "WordEdit", "source_of"]

OFFERED = ("replace", "refine")  # the edit types the panel offers ("reweight": write "(word:2)" in the edited prompt)
# a word edit's settings in its PNG, in the panel's order, and what a result without them stands for
EDIT_SETTINGS = {"edit_prompt": "", "edit_type": PromptEdit().edit_type, "cross_replace_steps": DEFAULT_CROSS_REPLACE,
                 "self_replace_steps": DEFAULT_SELF_REPLACE}
CROSS_LABEL = "word maps from the source for the first … of the steps"
SELF_LABEL = "layout (self-attention) from the source for the first … of the steps"


def selected_result(gallery, selected) -> tuple[Path | None, dict]:
    """(file, settings) of a gallery's selected result (the first when none is selected); (None, {}) for an empty one."""
    items = list(gallery or [])
    if not items:
        return None, {}
    item = items[min(int(selected or 0), len(items) - 1)]
    path = Path(str(item[0] if isinstance(item, (list, tuple)) else item))  # (path, caption) or a path
    return path, read_settings(path)


def source_of(settings: dict) -> tuple[int, str]:
    """(the seed of its noise, its source prompt) of a result: a plain result's image k is drawn from seed + k; both
    pictures of a word edit from its source's seed, which its PNG carries."""
    seed = int(settings.get("seed", 0))
    if "edit_prompt" in settings:
        return seed, str(settings.get("prompt", ""))
    return seed + int(settings.get("index", 0)), str(settings.get("prompt", ""))


class WordEdit:
    """The word edit's panel under the Sample tab's results (its gallery, its form, its status line)."""

    def __init__(self, page: Page, sample) -> None:
        """sample: the Sample tab it sits in (denoiser.app.sample_tab, which imports this module): its gallery, form,
        preview and status line, read once built."""
        self.page, self.sample, self.engine = page, sample, page.engine

    def build(self) -> None:
        """The panel (under the results, shown for a text model's)."""
        self.filled_from = gr.State(None)  # the result prompt the edited-prompt box was last filled with
        with gr.Accordion("change the words, keep the picture", open=True, visible=False, elem_id="word-edit") as box:
            self.box = box
            self.source = gr.Markdown(elem_id="word-edit-source")
            self.edit_words = gr.Textbox("", label="the edited prompt", elem_id="word-edit-prompt", max_lines=2,
                                         placeholder="the result's prompt with some words changed, e.g. red heart → "
                                                     "blue heart",
                                         info="the result drawn again from its noise beside its edit; weights work "
                                              "here too: (blue:1.5) heart")
            self.edit_type = gr.Radio(list(OFFERED), value=EDIT_SETTINGS["edit_type"], label="the words change by",
                                      elem_id="word-edit-type", info="replace: one word for another, as many words (red heart "
                                                                "→ blue heart); refine: words added or taken out (heart → "
                                                                "red heart)")
            with gr.Row():
                self.cross_replace = form_slider(0, 1, value=DEFAULT_CROSS_REPLACE, step=0.05, label=CROSS_LABEL,
                                                 elem_id="cross-replace", info="the words' maps; on weights/emoji it "
                                                                               "changes little (docs/prompt-editing.md)")
                self.self_replace = form_slider(0, 1, value=DEFAULT_SELF_REPLACE, step=0.05, label=SELF_LABEL,
                                                elem_id="self-replace", info="more: more of the source's layout, less "
                                                                             "room to change")
            self.run = gr.Button("change the words", variant="primary", elem_id="word-edit-run")

    @property
    def panel(self) -> list:
        """What "use these settings" fills besides the Sample form (use_settings): EDIT_SETTINGS' controls, in its order,
        and the prompt the edited-prompt box was filled from."""
        return [self.edit_words, self.edit_type, self.cross_replace, self.self_replace, self.filled_from]

    def wire(self, sampling: dict):
        """Its events; `sampling`: Generate's queue settings (its click's note is the Sample tab's: controls.queued).
        Returns the word edit's run (the Sample tab's Stop stops it: it runs on that tab's status line)."""
        sample = self.sample
        shown = [self.box, self.source, self.edit_words, self.filled_from]
        sample.gallery.change(self.new_results, [sample.gallery, self.filled_from], [sample.selected, *shown],
                              api_name=False, queue=False, show_progress="hidden")
        sample.gallery.select(self.shown_on_select, [sample.gallery, self.filled_from], shown, api_name=False,
                              queue=False, show_progress="hidden")
        self.run.click(None, js=scroll_to_js(sample.run.elem_id), api_name=False)  # its progress shows where Generate's
        running = self.run.click(self.edit, [sample.gallery, sample.selected, *self.panel[:4]], sample.outputs,
                                 api_name="word_edit", **sampling)
        running.success(self.form_of_result, sample.gallery, sample.form, api_name=False, queue=False)  # what ran
        return running

    def request(self, settings: dict, edit_prompt, edit_type, cross, self_) -> tuple[str, SampleRequest, str]:
        """(model, the SampleRequest of the edit, a note on what differs from the result) for editing the result whose
        settings are given, checked before any work: the result's form (ModelForm.request) with its prompt the source
        (image 0) and `edit_prompt` image 1, both from the result's noise."""
        if not settings:
            raise ValueError("generate first: the word edit redraws a result of the Sample tab")
        model = settings.get("model")
        if not self.page.form.is_text(model):
            raise ValueError("the word edit changes a text model's prompt: generate with a text model (e.g. emoji) first")
        seed, source = source_of(settings)
        if str(edit_prompt or "").strip() == source.strip():
            raise ValueError("the edited prompt is the result's own: change some of its words (red heart → blue heart)")
        if edit_type not in OFFERED:
            raise ValueError(f"the edit type must be one of {', '.join(OFFERED)}, got {str(edit_type)[:40]!r}")
        v = {k: settings.get(k, default) for k, default in SETTINGS_FORM.items()}
        result = self.page.form.request(model, v["scheduler"], v["steps"], seed, 2, v["class"] or NO_CLASS,
                                        v["guidance_scale"], 0.0, v["guide_scale"], v["timestep_spacing"], v["eta"],
                                        v["guidance_interval"], v["pag_layers"], source, v["negative_prompt"])
        edited = check_prompt("edited prompt", edit_prompt)
        if not edited:
            raise ValueError("type the edited prompt: the result's prompt with the words you want changed (red heart "
                             "→ blue heart)")
        edit = PromptEdit(edit_type, cross_replace_steps=float(cross), self_replace_steps=float(self_))
        request = dataclasses.replace(result, prompts=[result.prompts or "", edited], edit=edit)
        # an edit takes the source's self-attention, which perturbed-attention guidance replaces: the result's PAG is off
        note = " · attention guidance (PAG) off: an edit takes the source's layout" if float(v["pag_scale"] or 0) else ""
        return model, request, note

    def edit(self, gallery, selected, edit_prompt, edit_type, cross, self_, progress=gr.Progress(),
            request: gr.Request = None):
        """The selected result and its edit, [source, edit], from its noise. Yields updates keyed by the Sample tab's
        outputs (Generate's: the preview, the results, the generation and its views, the status line)."""
        status = self.sample.status
        try:  # the request checked before any work: a refusal is a message on the status line, not a failure
            _, settings = selected_result(gallery, selected)
            # `sample`, not `request`: that name is the page's gr.Request, which says whose job this is
            model, sample, note = self.request(settings, edit_prompt, edit_type, cross, self_)
            plan = self.engine.plan(model, sample)  # resolved once: the job below runs this plan
            plan_work(plan).check()
        except Exception as err:  # noqa: BLE001 - said on the status line, then raised
            yield from self.page.jobs.refuse(request, status, err)

        def job(on_step):
            return self.engine.generate(model, sample, plan=plan, on_step=on_step)

        gen = yield from self.page.jobs.run(request, status, job, progress, "denoising", self.sample.preview, enlarge)
        if gen is None:  # stopped: its line says where
            return
        edit, (source, edited) = sample.edit, sample.prompts
        made = {k: v for k, v in settings.items() if k not in ("index", "count", *EDIT_SETTINGS)}
        made.update(seed=sample.seed, num_images=2, pag_scale=0.0, prompt=source, edit_prompt=edited,
                    edit_type=edit.edit_type, cross_replace_steps=edit.cross_replace_steps[1],
                    self_replace_steps=edit.self_replace_steps[1])
        what = (f"{edit.edit_type}: the word maps from the source for the first {edit.cross_replace_steps[1]:.0%} of the "
                f"steps, its layout for the first {edit.self_replace_steps[1]:.0%}; both from the noise of seed {sample.seed}")
        yield self.page.jobs.done(request, status, {
            self.sample.preview: enlarge(to_pil(gen.images)), self.sample.gallery: result_files(gen.images, made),
            **self.page.tab(AttentionTab).show(gen),
            status: f"done: 2 image(s) of “{escape(made['prompt'])}” → “{escape(made['edit_prompt'])}”, "
                    f"{gen.num_steps} steps · {what}{note}" + few_steps_note(gen.num_steps)})

    def shown(self, gallery, selected, filled_from):
        """The panel for the gallery's selected result: shown for a text model's, with the result it edits in words;
        its prompt box filled with the result's prompt when that is a new one (a word edit's own results keep what
        was typed). Outputs: the panel, its line, the prompt box, the prompt it was filled from."""
        _, s = selected_result(gallery, selected)
        if not s or not self.page.form.is_text(s.get("model")):
            return gr.update(visible=False), "", gr.skip(), gr.skip()
        seed, source = source_of(s)
        said = f"“{escape(source)}”" if source else "no prompt"
        if "edit_prompt" in s:
            line = f"Edits the source of this word edit again ({said}, seed {seed}): both its pictures start from it."
        else:
            line = (f"Edits result {int(s.get('index', 0)) + 1} of {s.get('count', 1)} ({said}, seed {seed}). Select "
                    "another result to edit that one.")
        if "edit_prompt" in s or source == filled_from:
            return gr.update(visible=True), line, gr.skip(), gr.skip()
        return gr.update(visible=True), line, gr.update(value=source), source

    def shown_on_select(self, gallery, filled_from, evt: gr.SelectData):
        return self.shown(gallery, evt.index, filled_from)

    def new_results(self, gallery, filled_from) -> tuple:
        """A new gallery: its first result selected (Gradio shows none chosen), the panel for it."""
        return (0, *self.shown(gallery, 0, filled_from))

    def form_of_result(self, gallery) -> tuple:
        """After a word edit: the Sample form shows what its results were made with (their seed, two images, no PAG)."""
        return self.page.form.use_settings(gallery, 0)[:-1]

    def use_settings(self, gallery, selected) -> tuple:
        """ModelForm.use_settings, and from a word edit's PNG its edited prompt, edit type and fractions into the panel.
        Outputs: the Sample form, the panel's four controls, the prompt it was filled from, the status line."""
        *form, status = self.page.form.use_settings(gallery, selected)
        _, s = selected_result(gallery, selected)
        if "edit_prompt" not in s:
            return (*form, *(gr.skip(),) * (len(EDIT_SETTINGS) + 1), status)
        panel = [gr.update(value=s.get(k, default)) for k, default in EDIT_SETTINGS.items()]
        return (*form, *panel, s.get("prompt", ""), status)


    def settings_of_file(self, path) -> tuple:
        """A PNG a person dropped on the Sample tab: the settings it carries into the form (as use_settings), or, the
        form left as it was, words saying why not (png_settings.dropped_settings: no picture, a picture from
        elsewhere, a Photo tab result)."""
        if not path:
            return (*(gr.skip(),) * (len(SETTINGS_FORM) + len(EDIT_SETTINGS) + 1), gr.skip())
        try:
            dropped_settings(path, "Sample")
        except ValueError as err:
            return (*(gr.skip(),) * (len(SETTINGS_FORM) + len(EDIT_SETTINGS) + 1), str(err))
        return self.use_settings([(str(path), "")], 0)

"""The Sample tab's form: a model's best settings (what `resolve` fills for it: its sampler, steps and guidance), the
"try these" rows and example prompts, the work budget's note, the form read as one SampleRequest (`ModelForm.request`)
and refilled from a result's PNG. `ModelForm` binds them to an engine.
"""

from __future__ import annotations

import html
import re
from pathlib import Path

import gradio as gr

from denoiser.app.engine import check_prompt
from denoiser.app.form_limits import LIMITS, check_int, check_scales
from denoiser.app.png_settings import read_settings
from denoiser.app.work_budget import plan_work
from denoiser.request import GuidanceRequest, SampleRequest
from denoiser.sampling.plan import Plan

__all__ = ["ModelForm", "PROMPTS", "NO_CLASS", "MODELS_OWN", "SETTINGS_FORM", "FEW_STEPS", "guidance_info", "escape",
           "few_steps_note", "form_request"]

# example prompts a text model's Sample tab offers to click where its folder names none (sampling.json's example_prompts,
# chosen by prompt fidelity: ModelForm.example_prompts)
PROMPTS = ("red apple", "grinning face", "red heart", "pizza", "rocket", "cat", "sun", "ghost")
NO_CLASS = "(any)"
MODELS_OWN = "(the model's)"  # an advanced setting left to the model folder (its scheduler config, sampling.json)
# the Sample tab's form as a result's PNG carries it (`SampleTab.form` orders the form's controls the same way), and
# the values of settings a result written before them lacks
SETTINGS_FORM = {"model": None, "scheduler": None, "steps": None, "seed": None, "num_images": None, "class": None,
                 "guidance_scale": None, "pag_scale": None, "guide_scale": None, "timestep_spacing": MODELS_OWN,
                 "eta": 0.0, "guidance_interval": "", "pag_layers": "", "prompt": "", "negative_prompt": ""}
# the Sample form's advanced settings and its negative prompt (SETTINGS_FORM's names: `SampleTab.wire` finds their
# controls by them): what a "try these" row resets (filled_form)
ADVANCED = ("timestep_spacing", "eta", "guidance_interval", "pag_layers", "negative_prompt")
FEW_STEPS = 10  # sampling with fewer steps than this leaves visible noise (DDIM on the shipped models)


def guidance_info(interval=None, prompt: bool = False) -> str:
    """The classifier-free guidance slider's note (for a text model's prompt with `prompt`); names the steps a model's
    sampling.json limits guidance to."""
    what = "prompt" if prompt else "class"
    text = f"classifier-free guidance: 2-3 makes the {what} clearer, 1 = off, needs a {what}"
    if interval:
        text += f"; this model guides steps t = {interval[0]:g}..{interval[1]:g} only (its measured interval)"
    return text


def escape(text: str) -> str:
    """A person's text (a prompt) shown in Markdown as itself: no HTML, no emphasis, no links."""
    return re.sub(r"([\\`*_{}\[\]()#+!|~-])", r"\\\1", html.escape(text[:200], quote=False))


def few_steps_note(steps: int) -> str:
    """A warning for settings that give noise rather than pictures."""
    if steps >= FEW_STEPS:
        return ""
    return f" · **only {steps} step(s): the images are still mostly noise; use {FEW_STEPS} or more**"



def form_request(classes: list[str], text: bool, scheduler=None, steps=None, seed=0, num_images=None, class_name=None,
                 guidance_scale=None, pag_scale=None, guide_scale=None, timestep_spacing=None, eta=None,
                 guidance_interval=None, pag_layers=None, prompt=None, negative_prompt=None, *,
                 typed: bool = False) -> SampleRequest:
    """The Sample tab's form (SETTINGS_FORM's fields after the model, as the page or the /generate API sends them) as
    the one SampleRequest Generate runs, each value checked against the page's LIMITS (an API call is held to what
    the page allows). `classes`, `text`: the model's class names, and whether it takes a prompt (a class model's page
    hides and empties the prompts: none is read for it). The class by name, checked against `classes`. A field None
    (an API call's unset, an emptied box) is left unset, the model's own as `resolve` fills it (the advanced settings
    at MODELS_OWN or empty too), except on the page (`typed`), where a number box a person emptied is refused, named as
    every refusal names it; a seed has no model's own."""
    fields = {}
    for name, label, value in (("steps", "steps", steps), ("num_images", "number of images", num_images),
                               ("seed", "seed", seed)):
        if value is not None or typed or name == "seed":  # check_int says which box is empty
            fields[name] = check_int(label, value, *LIMITS[name])
    if class_name not in (None, "", NO_CLASS) and class_name not in classes:
        raise ValueError(f"class {str(class_name)[:40]!r} is not one of this model's classes: {', '.join(classes) or 'none'}")
    if eta is not None:
        if not isinstance(eta, (int, float)) or not 0 <= eta <= 1:
            raise ValueError(f"eta must be a number in 0..1, got {eta!r}")
        fields["eta"] = float(eta)
    guidance = GuidanceRequest(guidance_interval=guidance_interval or None, pag_layers=pag_layers or None,
                               **check_scales(guidance_scale, pag_scale, guide_scale))
    return SampleRequest(
        **fields, classes=classes.index(class_name) if class_name in classes else None,
        prompts=check_prompt("prompt", prompt) if text else None,
        negative_prompts=check_prompt("negative prompt", negative_prompt) if text else None,
        scheduler=None if scheduler in ("", MODELS_OWN) else scheduler,
        timestep_spacing=None if timestep_spacing in ("", MODELS_OWN) else timestep_spacing, guidance=guidance)


class ModelForm:
    """What the form shows for a model: the Sample tab's form handlers, and the Photo tab's class and guidance choices
    (the engine's models, in the page's words). What a model samples with when a setting is left unset is read from
    its plan (`resolved`): the folder's defaults are applied once, by denoiser.sampling.plan.resolve."""

    def __init__(self, engine) -> None:
        self.engine = engine

    def loads(self, model: str) -> bool:
        """Whether a model folder loads and its defaults resolve (the page offers broken folders in the model list,
        which says why)."""
        return self.resolved(model) is not None

    def resolved(self, model, class_name=None, prompt=None) -> Plan | None:
        """What Generate runs for `model` with every setting left unset but a class (by name) or a prompt: its folder's
        sampler, steps and guidance as `resolve` fills them (the classifier-free scale only with a class or prompt); the
        autoguidance scale 1 where the folder ships no guide (the page hides that slider). None for a folder that does
        not load (the page says why when it is used)."""
        if not model:
            return None
        try:
            names, ships_guide = self._class_names(model), "guide_model" in (self.engine.defaults(model).guidance or {})
            guidance = GuidanceRequest(guide_scale=None if ships_guide else 1.0)
            request = SampleRequest(classes=names.index(class_name) if class_name in names else None,
                                    prompts=(prompt or None) if self.is_text(model) else None, guidance=guidance)
            return self.engine.plan(model, request)
        except (ValueError, TypeError, OSError):
            return None

    def _class_names(self, model) -> list[str]:
        try:
            return self.engine.classes(model) if model else []
        except ValueError:
            return []

    def class_choices(self, model, current=None):
        """The Photo tab's class selector for `model`: the class shown stays when the model has it, else "(any)"."""
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
            return bool(model) and self.engine.views.is_text(model)
        except (ValueError, OSError):
            return False

    def example_row(self, model: str, seed: int) -> list:
        """A "try these" row for `model` (one that `loads`): everything the Sample tab sets, at what the model samples
        with (`resolved`) given a class or, for a text model, a prompt."""
        names = self._class_names(model)
        class_name = names[seed % len(names)] if names else NO_CLASS
        prompts = self.example_prompts(model)
        prompt = prompts[seed % len(prompts)] if self.is_text(model) else ""
        own = self.resolved(model, class_name, prompt)
        return [model, own.scheduler_name, own.steps, seed, own.num_images, class_name, own.guidance.scale,
                own.guidance.pag_scale, own.guidance.guide_scale, prompt]

    def example_prompts(self, model) -> tuple[str, ...]:
        """The prompts a text model's examples offer: its folder's (sampling.json's example_prompts, the prompts it was
        measured to draw), else PROMPTS."""
        try:
            own = tuple(self.engine.defaults(model).example_prompts) if model else ()
        except (ValueError, OSError):
            own = ()
        return own or PROMPTS

    def request(self, model, scheduler=None, steps=None, seed=0, num_images=None, class_name=None, guidance_scale=None,
                pag_scale=None, guide_scale=None, timestep_spacing=None, eta=None, guidance_interval=None,
                pag_layers=None, prompt=None, negative_prompt=None, *, typed: bool = False) -> SampleRequest:
        """The Sample tab's form for `model` as one SampleRequest (form_request, with the model's classes and whether
        it takes a prompt): what Generate, the /generate API, the budget note and a word edit resolve (Engine.plan)."""
        classes = self.engine.classes(model) if model else []
        return form_request(classes, self.is_text(model), scheduler, steps, seed, num_images, class_name, guidance_scale,
                            pag_scale, guide_scale, timestep_spacing, eta, guidance_interval, pag_layers, prompt,
                            negative_prompt, typed=typed)

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
        # the file name as code: Markdown would turn its `_red_1.5_` into italics
        return (*updates.values(), f"settings of `{path.name}` restored: press Generate")

    def budget_note(self, model, steps, num_images, class_name, guidance_scale=1.0, pag_scale=0.0, guide_scale=1.0,
                    scheduler=None, timestep_spacing=MODELS_OWN, guidance_interval="", pag_layers="", prompt="",
                    negative_prompt="") -> str:
        """The work Generate would do with this form against the server's budget, shown under the sliders before
        Generate: the plan Generate samples (the model folder's guidance interval and guide included) counted by the
        rule its refusal uses (denoiser.app.work_budget), so the note says "over" exactly when Generate refuses. Nothing for
        a form Generate refuses for another reason (it says why). scheduler and the advanced settings as Generate
        reads them (request): left unset, the model's own."""
        try:
            request = self.request(model, scheduler, steps, 0, num_images, class_name, guidance_scale, pag_scale,
                                   guide_scale, timestep_spacing, 0.0, guidance_interval, pag_layers, prompt,
                                   negative_prompt)
            plan = self.engine.plan(model, request)
            work = plan_work(plan)
        except (ValueError, TypeError, OSError):
            return ""
        # a text model's prompt, as it is typed: read with marks dropped, cut, words it never saw (Plan.image_notes)
        said = "".join(f" · **{escape(note)}**" for note in plan.image_notes(0))
        if not work.over:
            return f"work: {work.units:,.0f} of {work.budget:,.0f} units" + said
        return (f"**over the work budget** ({work.units:,.0f} of {work.budget:,.0f} units): at most {work.max_steps} "
                f"steps with {work.num_images} images, or {work.max_images} images with {work.steps} steps" + said)

    def model_form(self, model, current_class=None):
        """The Sample tab set to what the chosen model samples with (on load, and when a person picks a model): a class
        (sample_class_choices), and the sampler, steps, guidance, attention guidance and autoguidance its plan has
        (`resolved`; the autoguidance slider only where the folder ships a guide)."""
        class_update = self.sample_class_choices(model, current_class)
        own = self.resolved(model, class_update["value"], self._any_prompt(model))
        if own is None:  # a model that does not load: the page says so when used
            return (class_update, *(gr.skip(),) * 5)
        ships_guide = "guide_model" in (self.engine.defaults(model).guidance or {})
        return (class_update, gr.update(value=own.guidance.scale, **self.guidance_label(model, own)),
                gr.update(value=own.scheduler_name), gr.update(value=own.steps),
                gr.update(value=own.guidance.pag_scale), gr.update(value=own.guidance.guide_scale, visible=ships_guide))

    def _any_prompt(self, model) -> str | None:
        """A text model's guidance is shown for a prompt (the slider says "with a prompt"): its first example prompt
        stands for the one a person will type."""
        return self.example_prompts(model)[0] if self.is_text(model) else None

    def cfg_default(self, model, class_name):
        """The model's classifier-free scale once a class is chosen; 1 (off) for "(any)", which it needs (its plan's,
        `resolved`). The slider's note names the steps the model guides when its sampling.json limits them. (The Photo
        tab's: a text model runs unconditioned until a prompt is typed, so there it starts at 1 and says so.)"""
        if self.is_text(model):
            return gr.update(value=1.0, label="guidance (with a prompt)", info="a text model: without a prompt it runs "
                             "unconditioned, keep 1; a prompt typed (edit, inpaint) sets the model's scale")
        own = self.resolved(model, class_name)
        return gr.update(value=1.0 if own is None else own.guidance.scale, label="guidance (with a class)",
                         info=guidance_info(None if own is None else own.guidance.interval))

    def prompt_guidance(self, model, prompt) -> float:
        """The classifier-free scale a text model samples `prompt` with (its plan's, `resolved`); 1 where it resolves
        to none."""
        own = self.resolved(model, prompt=prompt)
        return 1.0 if own is None else own.guidance.scale

    def guidance_label(self, model, own: Plan | None = None) -> dict:
        """The Sample tab's guidance slider's label and note for `model`: guidance with a prompt (a text model) or
        with a class, and the steps its plan (`own`, else `resolved`) guides (its sampling.json's interval)."""
        text, own = self.is_text(model), own or self.resolved(model)
        interval = None if own is None else own.guidance.interval
        return dict(label=f"guidance (with a {'prompt' if text else 'class'})", info=guidance_info(interval, prompt=text))

    def filled_form(self, model, class_name) -> tuple:
        """After a "try these" row filled the Sample form: its model's class choices (the row's class shown), the
        guidance slider's label for its model (its value the row's), and the advanced settings the row has no column
        for back to the model's own (ADVANCED, SETTINGS_FORM's defaults): a row runs as it reads, and an interval typed
        before ("zzz") no longer refuses it."""
        return (self.sample_class_choices(model, class_name), gr.update(**self.guidance_label(model)),
                *(SETTINGS_FORM[name] for name in ADVANCED))

    def text_controls(self, model):
        """The Sample tab's prompt, negative prompt, example prompts' box and their table: shown for a text model (the
        table its example_prompts); hidden for a class model and kept for when a text model is picked again (what a
        class model samples takes no prompt: the request reads none for it, so its run and its PNGs have none)."""
        shown = self.is_text(model)
        samples = gr.update(samples=[[p] for p in self.example_prompts(model)]) if shown else gr.skip()
        return gr.update(visible=shown), gr.update(visible=shown), gr.update(visible=shown), samples

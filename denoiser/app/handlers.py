"""The web app's event handlers: each turns what a page sends into the engine's call and its answer into
what the page shows (images, galleries, sliders, Markdown). Here: Generate, its results and Stop; the Sample tab's form
is denoiser/app/form.py's, the Attention and Heads tabs' views denoiser/app/views.py's. The layout that binds them to
components is denoiser/app/layout.py; the work is the engine's (denoiser/app/engine.py); long jobs run through
denoiser/app/streaming.py.
"""

from __future__ import annotations

import logging
import os
import re
import tempfile
import zipfile
from pathlib import Path

import gradio as gr
import torch

from denoiser.app.earlier_results import recall, remember
from denoiser.app.engine import Engine
from denoiser.app.form import (
    FEW_STEPS,
    MODELS_OWN,
    NO_CLASS,
    PROMPTS,
    SETTINGS_FORM,
    ModelForm,
    escape,
    few_steps_note,
    guidance_info,
)
from denoiser.app.jobs import Jobs
from denoiser.app.streaming import not_started, relay, stream, user_error
from denoiser.app.views import N_VIEWS, NO_GENERATION, click_to_pixel, enlarge, generation_views, stages_text
from denoiser.app.work_budget import plan_work
from denoiser.image_io import save_with_settings, to_pil

__all__ = ["Handlers", "click_to_pixel", "enlarge", "stages_text", "guidance_info", "NO_CLASS", "MODELS_OWN",
           "N_VIEWS", "NO_GENERATION", "PROMPTS", "SETTINGS_FORM", "FEW_STEPS", "result_files", "results_zip", "escape", "few_steps_note"]

log = logging.getLogger("denoiser.app")


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


def results_zip(gallery) -> dict:
    """The "download all" button's update: the gallery's results in one zip named after the run, the name its files
    share without their '-2of8' ('cifar10-seed3-cat-ddim25-cfg3.zip'; Gradio's own button names every zip
    gallery.zip). Hidden while the gallery is empty."""
    paths = [Path(item[0] if isinstance(item, (list, tuple)) else item) for item in gallery or []]
    if not paths:
        return gr.update(value=None, visible=False)
    stems = {re.sub(r"-\d+of\d+$", "", p.stem) for p in paths}
    name = stems.pop() if len(stems) == 1 else os.path.commonprefix(sorted(stems)).strip("-_") or "results"
    path = Path(tempfile.mkdtemp(prefix="zip-", dir=os.environ.get("GRADIO_TEMP_DIR"))) / f"{name}.zip"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as zf:  # PNGs are compressed already
        for p in paths:
            zf.write(p, p.name)
    return gr.update(value=str(path), label=f"download all {len(paths)} ({path.name})", visible=True)


class Handlers:
    """Every event handler of the page, bound to one engine (and so to one set of models)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.form = ModelForm(engine)  # what the form shows for a model
        self.jobs = Jobs()  # which job of which session runs on which status line (Stop's line)

    def generate(self, model, scheduler=None, steps=None, seed=0, num_images=None, class_name=None, guidance_scale=None,
                 pag_scale=None, guide_scale=None, timestep_spacing=None, eta=None, guidance_interval=None, pag_layers=None,
                 prompt=None, negative_prompt=None, progress=gr.Progress(), request: gr.Request = None):
        """The Sample tab's Generate (the form as sample_form reads it), and the /generate API's: a field None is the
        model's own, as `denoiser sample` leaves a flag not given (the page sends its whole form, set to the model's
        values when it was picked)."""
        try:  # the request checked and resolved once, before any work: a refusal is a message, not a failure
            form = self.form.sample_form(model, scheduler, steps, seed, num_images, class_name, guidance_scale, pag_scale,
                                    guide_scale, timestep_spacing, eta, guidance_interval, pag_layers, prompt, negative_prompt)
            plan = self.engine.sample_plan(model, **form)  # resolved once: the job below runs this plan
            plan_work(plan).check()
        except Exception as err:  # noqa: BLE001
            error = user_error(err)
            self.jobs.finished(request, "status")
            yield (*(gr.skip(),) * (N_VIEWS + 2), not_started(error.message))  # the page's status line says why...
            raise error from None  # ... and an API caller gets the error (the page shows it as a toast that stays)
        label = form["class_label"]

        def job(on_step):
            return self.engine.generate(model, **form, on_step=on_step, plan=plan)

        with self.jobs.running(request, "status"):
            gen = yield from relay(stream(job, progress, "denoising"), N_VIEWS + 3, enlarge, status=True)
        # what ran: the plan's values (an API call's unset fields are the model's own)
        settings = dict(model=model, seed=plan.seed, scheduler=plan.scheduler_name, steps=plan.steps,
                        num_images=plan.num_images, guidance_scale=plan.guidance.scale, pag_scale=plan.guidance.pag_scale,
                        guide_scale=plan.guidance.guide_scale, precision=gen.precision,
                        **{"class": None if label is None else class_name})
        advanced = dict(timestep_spacing=timestep_spacing or MODELS_OWN, eta=float(eta or 0),
                        guidance_interval=guidance_interval or "", pag_layers=pag_layers or "",
                        prompt=form["prompt"] or "", negative_prompt=form["negative_prompt"] or "")
        settings.update({k: v for k, v in advanced.items() if v != SETTINGS_FORM[k]})  # only those changed
        gallery = result_files(gen.images, settings)
        of = f" of “{escape(gen.prompt)}”" if gen.prompt else (f" of class {escape(class_name)}" if label is not None else "")
        cut = "".join(f" · **{escape(note)}**" for note in gen.notes)  # a cut prompt, words the model never saw
        self.jobs.finished(request, "status")
        yield (
            enlarge(to_pil(gen.images)), gallery, *generation_views(self.engine, gen),
            f"done: {gen.images.shape[0]} image(s){of}, {gen.num_steps} steps, {gen.precision}" + cut
            + few_steps_note(gen.num_steps),
        )

    @staticmethod
    def keep_results(gallery, kept) -> tuple:
        """A finished run's results added to the ones kept in the browser (denoiser.app.earlier_results); the earlier results
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

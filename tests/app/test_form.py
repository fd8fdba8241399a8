"""The Sample tab's form (denoiser/app/form.py, issue 72 part 5): one request from form to plan. The page's Generate and
the /generate API read the form into one SampleRequest (ModelForm.request), the engine resolves it once, and what the
form shows for a model is what that resolve fills: the folder's defaults are applied in one place."""

from __future__ import annotations

import inspect
import json

import pytest
import torch
from diffusers import DDPMScheduler

gr = pytest.importorskip("gradio")

from denoiser import UNet  # noqa: E402
from denoiser.app import engine as engine_module  # noqa: E402
from denoiser.app.engine import Engine  # noqa: E402
from denoiser.app.form import ModelForm  # noqa: E402
from denoiser.app.sample_tab import SampleTab  # noqa: E402
from denoiser.request import GuidanceRequest, SampleRequest  # noqa: E402
from denoiser.sampling.pipeline import save_pipeline  # noqa: E402
from tests.conftest import TINY, app_page  # noqa: E402

# the Sample form as the page sends it (SETTINGS_FORM's order), every field set
FORM = ["m", "ddim", 3, 1, 2, "blue", 2.0, 1.0, 1.0, "trailing", 0.5, "0, 600", "mid_attn", "", ""]


@pytest.fixture
def weights(tmp_path):
    """A class model "m" whose folder names its steps, guidance and attention guidance (sampling.json)."""
    torch.manual_seed(0)
    folder = save_pipeline(UNet(**TINY, num_class_embeds=3).eval(), DDPMScheduler(), tmp_path / "weights" / "m",
                           classes=["red", "green", "blue"])
    (folder / "sampling.json").write_text(json.dumps({"num_inference_steps": 7, "guidance_scale": 2.5, "pag_scale": 0.5}))
    return folder.parent


def _requests(monkeypatch) -> list[SampleRequest]:
    """The requests the engine resolves from here on (Engine.plan's)."""
    seen, plan = [], Engine.plan

    def recorded(self, model, request):
        seen.append(request)
        return plan(self, model, request)

    monkeypatch.setattr(Engine, "plan", recorded)
    return seen


def test_the_pages_generate_and_the_api_build_one_request_from_the_same_values(weights, tmp_path, monkeypatch):
    """The review: the Sample request changed shape four times (15 arguments, a dict, 16 keywords, a SampleRequest). The
    page's Generate listener and the /generate API's door each build one SampleRequest from the form's values, the
    same one, which is what the engine resolves and what the result's generation keeps to sample again."""
    monkeypatch.setenv("GRADIO_TEMP_DIR", str(tmp_path))
    page = app_page(weights)
    sample = page.tab(SampleTab)
    seen = _requests(monkeypatch)
    page_generate = [d for d in page.app.fns.values() if (sample.run._id, "click") in [tuple(t) for t in d.targets]
                     and inspect.isgeneratorfunction(d.fn)]
    api_generate = [d for d in page.app.fns.values() if d.api_name == "generate"]
    assert len(page_generate) == 1 and len(api_generate) == 1
    typed = [block.value for block in page_generate[0].inputs[len(FORM):]]  # the page's own inputs past the form
    outputs = [list(page_generate[0].fn(*FORM, *typed)), list(api_generate[0].fn(*FORM))]
    expected = SampleRequest(num_images=2, classes=2, seed=1, scheduler="ddim", steps=3, timestep_spacing="trailing",
                             eta=0.5, guidance=GuidanceRequest(guidance_scale=2.0, pag_scale=1.0, guide_scale=1.0,
                                                               guidance_interval="0, 600", pag_layers="mid_attn"))
    assert seen == [expected, expected]
    assert all(str(out[-1][sample.status]).startswith("done: 2 image(s) of class blue, 3 steps") for out in outputs)
    assert outputs[0][-1][page.generation].replay == expected  # what "switch off" samples again


def test_the_sliders_show_what_resolve_fills_for_the_folder(weights, monkeypatch):
    """The review: the folder's defaults were applied in resolve, again in ModelForm and in own_scheduler. The form now
    shows what resolve returns: a resolve that filled other values would show those (here one step more)."""
    form = ModelForm(Engine(weights))
    _, guidance, scheduler, steps, pag, guide = form.model_form("m")
    assert (scheduler["value"], steps["value"], guidance["value"], pag["value"], guide["value"]) == ("ddim", 7, 2.5, 0.5, 1.0)
    resolve = engine_module.resolve

    def one_step_more(request, model, **kwargs):
        plan = resolve(request, model, **kwargs)
        plan.steps += 1
        return plan

    monkeypatch.setattr(engine_module, "resolve", one_step_more)
    assert form.model_form("m")[3]["value"] == 8
    assert form.example_row("m", 0)[2] == 8  # the "try these" rows too
    assert form.cfg_default("m", "(any)")["value"] == 1.0 and form.cfg_default("m", "red")["value"] == 2.5


def test_a_folders_sampler_the_app_cannot_replay_shows_and_runs_the_built_in_one(weights, monkeypatch):
    """The app runs samplers whose steps it can re-run (APP_SCHEDULERS): a folder naming euler shows and samples
    DDIM, both from the one resolve; euler asked for by name is refused in words."""
    config = weights / "m" / "scheduler" / "scheduler_config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "_class_name": "EulerDiscreteScheduler"}))
    engine = Engine(weights)
    form = ModelForm(engine)
    assert form.model_form("m")[2]["value"] == "ddim"
    assert engine.plan("m", form.request("m", None, 2, 0, 1, "red")).scheduler_name == "ddim"
    with pytest.raises(ValueError, match=r"scheduler must be one of ddim, ddpm, dpm\+\+, unipc, got 'euler'"):
        engine.plan("m", form.request("m", "euler", 2, 0, 1, "red"))

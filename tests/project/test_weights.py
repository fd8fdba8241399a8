"""Shipped models: load, sample a few DDIM steps, and match what their model cards state."""

from __future__ import annotations

import json
import re

import pytest
import torch
import yaml
from diffusers import DDIMPipeline, DDIMScheduler, DiffusionPipeline

import denoiser  # noqa: F401
from denoiser.folders.model_dir import WEIGHTS_DIR, list_models, load_model
from denoiser.sampling.loop import make_sampler, sample
from tests.conftest import generators

SHIPPED = list_models(WEIGHTS_DIR)


def test_shipped_weights_are_small_and_safe():
    assert {"synthetic-shapes", "cifar10"} <= set(SHIPPED)
    total = sum(f.stat().st_size for f in WEIGHTS_DIR.rglob("*") if f.is_file())
    assert total < 60e6
    for name in SHIPPED:
        assert not list((WEIGHTS_DIR / name).rglob("*.bin")) and not list((WEIGHTS_DIR / name).rglob("*.pkl"))


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_model_samples_as_diffusers_does(name):
    unet, sched = load_model(WEIGHTS_DIR / name)
    assert unet.dtype == torch.float32  # shipped in fp16, upcast on load
    S = unet.config.sample_size
    res = sample(unet, make_sampler("ddim", sched.config), 2, 3, seed=0)
    assert res.images.shape == (2, 3, S, S)
    # the same weights in diffusers' own DDIMPipeline (no class: the "no class" embedding) give the same images
    pipe = DDIMPipeline(unet=unet, scheduler=DDIMScheduler.from_config(sched.config))
    ref = pipe(batch_size=2, num_inference_steps=3, generator=generators(0, 2), output_type="np").images
    torch.testing.assert_close(res.images, torch.from_numpy(ref).permute(0, 3, 1, 2), rtol=0, atol=2e-4)
    if unet.config.num_class_embeds:  # the class changes the images
        other = sample(unet, make_sampler("ddim", sched.config), 2, 3, seed=0, class_labels=1).images
        first = sample(unet, make_sampler("ddim", sched.config), 2, 3, seed=0, class_labels=0).images
        assert (other - first).abs().mean() > 0.01


@pytest.mark.parametrize("name", SHIPPED)
def test_card_states_the_real_config(name):
    card = (WEIGHTS_DIR / name / "README.md").read_text()
    block = re.search(r"```yaml\n(.*?)```", card, re.S)
    assert block, "the card shows its config in a ```yaml block"
    stated = yaml.safe_load(block.group(1))["model"]
    actual = json.loads((WEIGHTS_DIR / name / "unet" / "config.json").read_text())
    for key, value in stated.items():
        got = actual[key]
        assert (list(got) if isinstance(got, (list, tuple)) else got) == value, key
    assert "denoiser train --config configs/" in card and "bits/dim" in card
    assert (WEIGHTS_DIR / name / "samples.png").is_file()


@pytest.mark.parametrize("name", SHIPPED)
def test_loads_with_diffusion_pipeline(name):
    pipe = DiffusionPipeline.from_pretrained(WEIGHTS_DIR / name, torch_dtype=torch.float32)
    out = pipe(batch_size=1, num_inference_steps=2, generator=torch.Generator().manual_seed(0), output_type="np")
    assert out.images.shape[1:] == (pipe.unet.config.sample_size, pipe.unet.config.sample_size, 3)


class _Sampled(Exception):
    """Raised by the spy below once a front door has handed its scheduler and step count to the sampling loop."""


@pytest.mark.parametrize("name", SHIPPED)
def test_every_front_door_samples_with_the_folders_measured_best(name, monkeypatch, tmp_path):
    """Each shipped folder's knee of the sampling frontier (docs/guidance.md): its scheduler/ names the sampler and
    its sampling.json the step count, and the CLI, `evaluate --fid`, the pipeline and the app all sample with them."""
    from denoiser.app.engine import Engine
    from denoiser.app.form import ModelForm
    from denoiser.cli.main import main
    from denoiser.request import BUILT_IN

    folder = WEIGHTS_DIR / name
    own = json.loads((folder / "scheduler" / "scheduler_config.json").read_text())["_class_name"]
    measured = folder / "sampling.json"
    steps = json.loads(measured.read_text()).get("num_inference_steps", BUILT_IN["steps"]) if measured.is_file() else 50
    seen = []

    def spy(unet, scheduler, num_images, num_inference_steps, *args, **kwargs):
        seen.append((type(scheduler).__name__, num_inference_steps))
        raise _Sampled

    monkeypatch.setattr("denoiser.sampling.plan.sample", spy)
    doors = {
        "sample": lambda: main(["sample", "--model", str(folder), "--num-images", "1", "--out", str(tmp_path / "s.png")]),
        "evaluate --fid": lambda: main(["evaluate", "--model", str(folder), "--fid", "--num-samples", "2",
                                        "--reference", str(tmp_path / "none.safetensors")]
                                       + (["--prompt", "red apple"] if (folder / "text_encoder").is_dir() else [])),
        "pipeline": lambda: DiffusionPipeline.from_pretrained(folder)(1),
    }
    monkeypatch.setattr("denoiser.evaluate.fid.reference_statistics", lambda *a, **k: None)
    monkeypatch.setattr("denoiser.evaluate.fid.InceptionFeatures", lambda *a, **k: None)
    for door, call in doors.items():
        with pytest.raises(_Sampled):
            call()
        assert seen.pop() == (own, steps), door
    # the app: choosing the model sets the form's sampler and steps to the folder's, and Generate passes them on
    engine = Engine(WEIGHTS_DIR)
    form = ModelForm(engine)
    shown = form.model_form(name)
    scheduler, form_steps = shown[2]["value"], shown[3]["value"]
    assert form_steps == steps
    with pytest.raises(_Sampled):
        engine.generate(name, form.request(name, scheduler, form_steps, 0, 1))
    assert seen.pop() == (own, steps), "app"

"""Shipped models: load, sample a few DDIM steps, and match what their model cards state."""

from __future__ import annotations

import json
import re

import pytest
import torch
import yaml
from diffusers import DiffusionPipeline

import denoiser  # noqa: F401
from denoiser.pipeline import WEIGHTS_DIR, list_models, load_model
from denoiser.sample import make_sampler, sample

SHIPPED = list_models(WEIGHTS_DIR)


def test_shipped_weights_are_small_and_safe():
    assert {"synthetic-shapes", "cifar10-small"} <= set(SHIPPED)
    total = sum(f.stat().st_size for f in WEIGHTS_DIR.rglob("*") if f.is_file())
    assert total < 60e6
    for name in SHIPPED:
        assert not list((WEIGHTS_DIR / name).rglob("*.bin")) and not list((WEIGHTS_DIR / name).rglob("*.pkl"))


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_model_samples(name):
    unet, sched = load_model(WEIGHTS_DIR / name)
    assert unet.dtype == torch.float32  # shipped in fp16, upcast on load
    n_cls = unet.config.num_class_embeds
    res = sample(unet, make_sampler("ddim", sched.config), 2, 3, seed=0, class_labels=0 if n_cls else None)
    S = unet.config.sample_size
    assert res.images.shape == (2, 3, S, S)
    assert torch.isfinite(res.images).all() and res.images.min() >= 0 and res.images.max() <= 1
    assert res.images.std() > 0.01  # not a constant image


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

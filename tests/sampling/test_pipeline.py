"""DenoiserPipeline: diffusers' loading and calling conventions, classes and guidance, images equal to sample()."""

from __future__ import annotations

import json
import logging
import shutil
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from diffusers import DDIMPipeline, DDIMScheduler, DDPMPipeline, DDPMScheduler, DiffusionPipeline, RePaintPipeline

import denoiser  # noqa: F401  (registers DenoiserPipeline with diffusers)
from denoiser import UNet
from denoiser.folders.model_dir import WEIGHTS_DIR, load_model
from denoiser.sampling.guidance import Guidance
from denoiser.sampling.loop import make_sampler, sample
from denoiser.sampling.pipeline import DenoiserPipeline, save_pipeline
from tests.conftest import TINY, generators

SHAPES = WEIGHTS_DIR / "synthetic-shapes"  # 4 classes: circle, square, triangle, cross


@pytest.fixture
def shapes(tmp_path):
    """A copy of the shipped synthetic-shapes folder with a sampling.json (CFG 2 + PAG 0.5)."""
    folder = tmp_path / "shapes"
    shutil.copytree(SHAPES, folder)
    (folder / "sampling.json").write_text(json.dumps({"guidance_scale": 2.0, "pag_scale": 0.5}))
    return folder


def _quiet(pipe):
    pipe.set_progress_bar_config(disable=True)
    return pipe


def test_loads_as_our_pipeline_without_warnings(shapes, caplog):
    with warnings.catch_warnings(), caplog.at_level(logging.WARNING):
        warnings.simplefilter("error")
        pipe = DiffusionPipeline.from_pretrained(shapes)
    assert isinstance(pipe, DenoiserPipeline) and isinstance(pipe.unet, UNet)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], [r.getMessage() for r in caplog.records]
    assert pipe.classes == ["circle", "square", "triangle", "cross"]
    assert pipe.sampling_defaults["guidance_scale"] == 2.0
    assert json.loads((shapes / "model_index.json").read_text())["_class_name"] == "DenoiserPipeline"


@pytest.mark.parametrize("scheduler", ["ddim", "ddpm", "dpm++"])
def test_images_equal_sample_with_the_same_seed_scheduler_and_guidance(shapes, scheduler):
    # no guidance arguments: sampling.json's CFG 2 + PAG 0.5 apply (a class is given)
    pipe = _quiet(DiffusionPipeline.from_pretrained(shapes))
    pipe.scheduler = make_sampler(scheduler, pipe.scheduler.config)
    out = pipe(3, class_labels="triangle", num_inference_steps=4, generator=generators(5, 3),
               output_type="pt").images
    unet, sched = load_model(shapes, channels_last=False)  # the pipeline keeps diffusers' NCHW layout
    ref = sample(unet, make_sampler(scheduler, sched.config), 3, 4, seed=5, class_labels=2,
                 guidance=Guidance(scale=2.0, pag_scale=0.5)).images
    assert torch.equal(out, ref)  # bit-identical: the same loop on the same weights


def test_output_types_labels_and_explicit_guidance(shapes):
    pipe = _quiet(DiffusionPipeline.from_pretrained(shapes))
    pipe.scheduler = DDIMScheduler.from_config(pipe.scheduler.config)
    kw = dict(num_inference_steps=3, guidance_scale=1.0, pag_scale=0.0)  # explicit arguments beat sampling.json
    pt = pipe(2, class_labels=["circle", 3], generator=generators(1, 2), output_type="pt", **kw).images
    np_ = pipe(2, class_labels=[0, "cross"], generator=generators(1, 2), output_type="np", **kw).images
    pil = pipe(2, class_labels=[0, 3], generator=generators(1, 2), **kw).images
    unet, sched = load_model(shapes, channels_last=False)
    ref = sample(unet, make_sampler("ddim", sched.config), 2, 3, seed=1, class_labels=[0, 3]).images
    assert torch.equal(pt, ref)
    assert isinstance(np_, np.ndarray) and np_.shape == (2, 16, 16, 3) and np.array_equal(np_, ref.permute(0, 2, 3, 1).numpy())
    assert len(pil) == 2 and pil[0].size == (16, 16)
    assert np.array_equal(np.asarray(pil[1]), (np_[1] * 255).round().astype(np.uint8))
    img, = pipe(1, generator=generators(1, 1), output_type="pt", return_dict=False, **kw)
    assert img.shape == (1, 3, 16, 16)  # no class: the "no class" row, and sampling.json's CFG left out
    # sampling.json's CFG 2 + PAG 0.5 in an interval no step of 666, 333, 0 falls in: the plain images
    outside = pipe(2, class_labels=[0, 3], num_inference_steps=3, guidance_interval=(900, 999),
                   generator=generators(1, 2), output_type="pt").images
    assert torch.equal(outside, ref)


def test_callback_on_step_end_sees_and_replaces_the_latents(shapes):
    pipe = _quiet(DiffusionPipeline.from_pretrained(shapes))
    seen = []

    def zero_after_last(pipe_, i, t, kwargs):
        seen.append((i, int(t), kwargs["latents"].shape))
        return {"latents": torch.zeros_like(kwargs["latents"])} if i == 2 else {}

    out = pipe(2, num_inference_steps=3, generator=torch.Generator().manual_seed(0), output_type="pt",
               callback_on_step_end=zero_after_last).images
    assert [i for i, _, _ in seen] == [0, 1, 2] and seen[0][1] > seen[-1][1] and seen[0][2] == (2, 3, 16, 16)
    assert torch.equal(out, torch.full_like(out, 0.5))  # latents 0 -> image 0.5


def test_bad_arguments_are_explained_before_work(shapes, tmp_path):
    pipe = _quiet(DiffusionPipeline.from_pretrained(shapes))
    with pytest.raises(ValueError, match="unknown class 'dog'.*circle, square"):
        pipe(1, class_labels="dog")
    with pytest.raises(ValueError, match="out of range.*0..3"):
        pipe(1, class_labels=7)
    with pytest.raises(ValueError, match="one per image \\(3\\)"):
        pipe(3, class_labels=[0, 1])
    with pytest.raises(ValueError, match="output_type"):
        pipe(1, output_type="latent")
    with pytest.raises(ValueError, match="classifier-free guidance .* needs .* a class"):
        pipe(1, guidance_scale=3.0)
    plain = save_pipeline(UNet(**TINY).eval(), DDPMScheduler(), tmp_path / "plain")
    with pytest.raises(ValueError, match="unconditional"):
        _quiet(DiffusionPipeline.from_pretrained(plain))(1, class_labels=0)


def test_still_loads_in_diffusers_own_pipelines(shapes):
    for cls in (DDPMPipeline, DDIMPipeline, RePaintPipeline):
        pipe = cls.from_pretrained(shapes)
        assert isinstance(pipe.unet, UNet)
    pipe = _quiet(DDIMPipeline.from_pretrained(shapes))
    theirs = pipe(batch_size=2, num_inference_steps=3, generator=torch.Generator().manual_seed(4), output_type="np").images
    ours = _quiet(DiffusionPipeline.from_pretrained(shapes))
    ours.scheduler = DDIMScheduler.from_config(ours.scheduler.config)
    mine = ours(2, num_inference_steps=3, generator=torch.Generator().manual_seed(4), output_type="np", pag_scale=0).images
    # no class, PAG off (sampling.json sets 0.5): DDIMPipeline's images, to rounding: ours runs the 3x3 convolutions
    # by Winograd's algorithm (denoiser.fast.winograd), diffusers' pipeline calls the UNet's own nn.Conv2d
    np.testing.assert_allclose(mine, theirs, rtol=0, atol=1e-5)


def test_save_pretrained_round_trip_keeps_class_names(tmp_path):
    torch.manual_seed(0)
    unet = UNet(**TINY, num_class_embeds=2).eval()
    folder = save_pipeline(unet, DDPMScheduler(), tmp_path / "m", classes=["cat", "dog"])
    assert (folder / "classes.txt").read_text().split() == ["cat", "dog"]
    pipe = DiffusionPipeline.from_pretrained(folder)
    assert pipe.classes == ["cat", "dog"]
    pipe.save_pretrained(tmp_path / "again")
    again = DiffusionPipeline.from_pretrained(tmp_path / "again")
    assert again.classes == ["cat", "dog"]
    assert all(torch.equal(a, b) for a, b in zip(unet.state_dict().values(), again.unet.state_dict().values()))
    with pytest.raises(ValueError, match="2 classes, got 3"):
        pipe.classes = ["a", "b", "c"]


def test_a_failed_save_keeps_the_old_folder(tmp_path, monkeypatch):
    unet = UNet(**TINY).eval()
    folder = save_pipeline(unet, DDPMScheduler(), tmp_path / "m")
    before = sorted(p.relative_to(folder) for p in folder.rglob("*"))

    def half_then_fail(self, save_directory, **kwargs):
        Path(save_directory).mkdir()
        (Path(save_directory) / "model_index.json").write_text("{")
        raise OSError("disk full")

    monkeypatch.setattr(DenoiserPipeline, "save_pretrained", half_then_fail)
    with pytest.raises(OSError, match="disk full"):
        save_pipeline(unet, DDPMScheduler(), folder)
    assert sorted(p.relative_to(folder) for p in folder.rglob("*")) == before
    assert [p.name for p in tmp_path.iterdir()] == ["m"]  # no temporary folder left
    assert isinstance(DiffusionPipeline.from_pretrained(folder), DenoiserPipeline)


def test_loads_in_bfloat16_and_shows_a_progress_bar(shapes, capsys):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        pipe = DiffusionPipeline.from_pretrained(shapes, dtype=torch.bfloat16)
    assert pipe.unet.dtype == torch.bfloat16
    out = pipe(2, class_labels="circle", num_inference_steps=3, guidance_scale=1.0, pag_scale=0.0,
               generator=generators(0, 2), output_type="pt").images
    assert "3/3" in capsys.readouterr().err  # diffusers' progress bar, one tick per step
    unet, sched = load_model(shapes, channels_last=False)
    ref = sample(unet, make_sampler("ddim", sched.config), 2, 3, seed=0, class_labels=0).images  # the folder's DDIM
    assert out.dtype == torch.float32 and (out - ref).abs().mean() < 0.05  # bf16 rounding, the same images


def test_the_pipeline_is_one_loaded_model_read_once(shapes, monkeypatch):
    """Issue 59 finding 6: the pipeline read sampling.json and classes.txt again on every call and handed the core its
    parts one by one. Now it is one LoadedModel, built once from its components (the folder's files read then) and
    again only when one is swapped, as diffusers users swap schedulers; the images follow the swapped scheduler."""
    from denoiser.folders import model_dir

    reads = []
    read = model_dir.read_defaults
    monkeypatch.setattr(model_dir, "read_defaults", lambda *a, **k: reads.append(a) or read(*a, **k))
    pipe = _quiet(DiffusionPipeline.from_pretrained(shapes))
    first = pipe(batch_size=2, num_inference_steps=3, generator=generators(0, 2), output_type="pt").images
    again = pipe(batch_size=2, num_inference_steps=3, generator=generators(0, 2), output_type="pt").images
    assert len(reads) == 1 and pipe.loaded() is pipe.loaded() and torch.equal(first, again)
    pipe.scheduler = DDPMScheduler.from_config(pipe.scheduler.config)
    ddpm = pipe(batch_size=2, num_inference_steps=3, generator=generators(0, 2), output_type="pt").images
    assert len(reads) == 2 and pipe.loaded().sampler is pipe.scheduler and not torch.equal(first, ddpm)

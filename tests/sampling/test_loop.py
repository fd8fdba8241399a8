"""The sampling loop (denoiser/sampling/loop.py, `sample` on a bare UNet; the request and its plan are
tests/sampling/test_plan.py's) against diffusers' pipelines, previews, capture during sampling, grids."""

from __future__ import annotations

import pytest
import torch
from diffusers import DDIMPipeline, DDPMPipeline, DDPMScheduler
from PIL import Image

from denoiser.image_io import save_grid
from denoiser.sampling.guidance import Guidance
from denoiser.sampling.loop import class_label_tensor, image_generators, make_sampler, sample, trajectory_strip
from tests.conftest import generators, seeded_noise


@pytest.mark.parametrize("name,pipeline_cls,kwargs", [
    ("ddim", DDIMPipeline, {"eta": 0.0}),
    ("ddim", DDIMPipeline, {"eta": 1.0}),
    ("ddpm", DDPMPipeline, {}),
])
def test_same_seed_same_images_as_diffusers(tiny_unet, name, pipeline_cls, kwargs):
    from diffusers import DDPMScheduler

    train = DDPMScheduler()
    ours = sample(tiny_unet, make_sampler(name, train.config), num_images=2, num_inference_steps=5, seed=7, **kwargs)
    pipe = pipeline_cls(unet=tiny_unet, scheduler=make_sampler(name, train.config))
    pipe.set_progress_bar_config(disable=True)
    theirs = pipe(batch_size=2, num_inference_steps=5, generator=generators(7, 2), output_type="pt",
                  **kwargs).images
    assert torch.equal(ours.images, theirs.permute(0, 3, 1, 2) if theirs.shape[-1] == 3 else theirs)


def test_channels_last_sampling_matches_the_pipeline(tiny_unet):
    # channels-last on CPU: the GroupNorm kernel while sampling
    from diffusers import DDPMScheduler

    from tests.model.test_unet import _cl_copy

    unet, sched = _cl_copy(tiny_unet), make_sampler("ddim", DDPMScheduler().config)
    ours = sample(unet, sched, num_images=3, num_inference_steps=4, seed=3).images
    pipe = DDIMPipeline(unet=tiny_unet, scheduler=make_sampler("ddim", DDPMScheduler().config))
    pipe.set_progress_bar_config(disable=True)
    theirs = pipe(batch_size=3, num_inference_steps=4, generator=generators(3, 3), output_type="pt").images
    # Both are fp32 but round differently (oneDNN's blocked convolutions and our GroupNorm vs NCHW torch):
    # ~1e-6 per UNet call, which DDIM's x0 = (x - sqrt(1-a)·eps) / sqrt(a) multiplies by up to
    # 1/sqrt(a_T) ~ 160 in the first step; a wrong layer or a missing add differs by ~0.1.
    torch.testing.assert_close(ours, theirs, rtol=0, atol=2e-4)


def test_dpm_solver_and_determinism(tiny_unet):
    from diffusers import DDPMScheduler

    sched = make_sampler("dpm++", DDPMScheduler().config)
    a = sample(tiny_unet, sched, 2, 4, seed=1).images
    b = sample(tiny_unet, sched, 2, 4, seed=1).images
    c = sample(tiny_unet, sched, 2, 4, seed=2).images
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert a.shape == (2, 3, 16, 16) and a.min() >= 0 and a.max() <= 1
    # diffusers' own pipeline with its DPM-Solver++ scheduler: the same images
    from diffusers import DPMSolverMultistepScheduler

    dpm = DPMSolverMultistepScheduler.from_config(DDPMScheduler().config, algorithm_type="dpmsolver++")
    pipe = DDPMPipeline(unet=tiny_unet, scheduler=dpm)
    ref = pipe(batch_size=2, num_inference_steps=4, generator=generators(1, 2), output_type="np").images
    torch.testing.assert_close(a, torch.from_numpy(ref).permute(0, 3, 1, 2), rtol=0, atol=1e-5)


def test_callback_trajectory_and_capture(tiny_unet):
    from diffusers import DDPMScheduler

    seen = []
    res = sample(tiny_unet, make_sampler("ddim", DDPMScheduler().config), 1, 6, seed=0, trajectory_every=2,
                 capture_steps=[0, 5], callback=lambda i, t, x, x0: seen.append((i, t, x0.shape)))
    assert [s[0] for s in seen] == list(range(6))
    assert len(res.trajectory) == 4  # steps 0, 2, 4 and the last
    assert sorted(res.attention) == [0, 5] and len(res.attention[5]) == 4
    plain = sample(tiny_unet, make_sampler("ddim", DDPMScheduler().config), 1, 6, seed=0).images
    assert torch.equal(plain, res.images)  # capturing never changes the result
    strip = trajectory_strip(res.trajectory)
    assert strip.shape == (8, 3, 16, 16)


def test_bad_requests_are_explained(tiny_unet):
    from diffusers import DDPMScheduler

    sched = make_sampler("ddim", DDPMScheduler().config)
    with pytest.raises(ValueError, match="steps must be in 1..1000"):
        sample(tiny_unet, sched, 1, 0)
    with pytest.raises(ValueError, match="unconditional"):
        sample(tiny_unet, sched, 1, 2, class_labels=1)
    with pytest.raises(ValueError, match="unknown scheduler"):
        make_sampler("heun", DDPMScheduler().config)


def test_image_generators_are_seeded_seed_plus_k():
    gens = image_generators(5, [2, 0])  # images 2 and 0 of a request with seed 5
    assert [g.initial_seed() for g in gens] == [7, 5]
    assert all(g.device.type == "cpu" for g in gens)


def test_class_labels_are_read_in_one_place():
    names = ("red", "green", "blue")
    assert class_label_tensor(None, 3, 3) is None  # no class: the model's "no class" row
    assert class_label_tensor("green", 3, 3, names).tolist() == [1, 1, 1]
    assert class_label_tensor(["red", 2, "1", torch.tensor(0)], 4, 3, names).tolist() == [0, 2, 1, 0]
    assert class_label_tensor(torch.tensor([2, 0]), 2, 3).tolist() == [2, 0]
    assert class_label_tensor("spread", 5, 3).tolist() == [0, 1, 2, 0, 1]
    for classes, num_classes, match in (
        (1, None, r"this model is unconditional \(it has no classes\): leave the class label out"),
        ("spread", 0, "'spread' needs a class-conditional model"),
        ([0, 1], 3, r"pass one class or one per image \(3\), got 2"),
        ("cat", 3, "unknown class 'cat'; this model's classes: red, green, blue"),
        ([3, -1, 3], 3, r"class label out of range: each class must be a whole number in 0..2, got \[3, -1\]"),
        (1.5, 3, r"whole number in 0..2, got \[1.5\]"),
    ):
        with pytest.raises(ValueError, match=match):
            class_label_tensor(classes, 3, num_classes, names)


def test_sample_refuses_a_label_count_that_fits_neither_one_nor_every_image(class_unet):
    sched = make_sampler("ddim", DDPMScheduler().config)
    with pytest.raises(ValueError, match=r"pass one class or one per image \(3\), got 2"):
        sample(class_unet, sched, 3, 2, class_labels=[0, 1])
    with pytest.raises(ValueError, match="out of range"):  # the UNet's own "no class" row is not a class to ask for
        sample(class_unet, sched, 1, 2, class_labels=3)


def test_grid_png(tmp_path):
    path = save_grid(torch.rand(6, 3, 8, 8), tmp_path / "g.png", nrow=3, scale=2)
    img = Image.open(path)
    assert img.format == "PNG" and img.size == (2 * (3 * 10 + 2), 2 * (2 * 10 + 2))
    with pytest.raises(ValueError, match=".png"):
        save_grid(torch.rand(1, 3, 8, 8), tmp_path / "g.jpg")


def test_classifier_free_guidance_combines_the_two_predictions():
    from diffusers import DDIMScheduler

    from denoiser.model.unet import UNet
    from tests.conftest import TINY

    torch.manual_seed(0)
    unet = UNet(**TINY, num_class_embeds=3).eval()
    sched = DDIMScheduler(num_train_timesteps=1000)
    w, labels = 2.5, torch.tensor([0, 2])
    got = sample(unet, sched, 2, 3, seed=1, class_labels=labels, guidance=Guidance(scale=w)).images
    # the same loop by hand: two separate UNet calls per step, combined as ε_u + w (ε_c − ε_u)
    sched = DDIMScheduler(num_train_timesteps=1000)
    sched.set_timesteps(3)
    x = seeded_noise((2, 3, 16, 16), 1)
    with torch.no_grad():
        for t in sched.timesteps:
            cond = unet(x, t, class_labels=labels).sample
            uncond = unet(x, t, class_labels=torch.full((2,), 3)).sample
            x = sched.step(uncond + w * (cond - uncond), t, x).prev_sample
    # one batched call against two: the convolutions round differently by batch (a few 1e-6 of ε), guidance scales it
    torch.testing.assert_close(got, (x / 2 + 0.5).clamp(0, 1), rtol=0, atol=1e-4)
    plain = sample(unet, DDIMScheduler(num_train_timesteps=1000), 2, 3, seed=1, class_labels=labels).images
    assert (plain - got).abs().max() > 1e-3  # guidance changes the images
    with pytest.raises(ValueError, match="class label"):
        sample(unet, sched, 2, 3, guidance=Guidance(scale=2.0))


def test_euler_follows_diffusers_conventions_and_eta_is_ddim_only(tiny_unet):
    from diffusers import EulerDiscreteScheduler

    sched = make_sampler("euler", DDPMScheduler().config)
    assert isinstance(sched, EulerDiscreteScheduler) and sched.init_noise_sigma > 1
    got = sample(tiny_unet, sched, 2, 4, seed=3).images
    # diffusers' pipeline convention by hand: latents × init_noise_sigma, scale_model_input before each call
    ref = EulerDiscreteScheduler.from_config(DDPMScheduler().config)
    ref.set_timesteps(4)
    x = seeded_noise((2, 3, 16, 16), 3) * ref.init_noise_sigma
    with torch.no_grad():
        for t in ref.timesteps:
            x = ref.step(tiny_unet(ref.scale_model_input(x, t), t).sample, t, x).prev_sample
    torch.testing.assert_close(got, (x / 2 + 0.5).clamp(0, 1), rtol=1e-4, atol=1e-5)
    for name in ("ddpm", "dpm++", "euler"):
        with pytest.raises(ValueError, match="DDIM only"):
            sample(tiny_unet, make_sampler(name, DDPMScheduler().config), 1, 2, eta=0.5)


def test_trailing_timestep_spacing_starts_at_the_last_timestep():
    lead = make_sampler("ddim", DDPMScheduler().config)
    trail = make_sampler("ddim", DDPMScheduler().config, timestep_spacing="trailing")
    lead.set_timesteps(4)
    trail.set_timesteps(4)
    assert int(trail.timesteps[0]) == 999 and int(lead.timesteps[0]) < 999
    from denoiser.diffusion import DiffusionConfig, make_noise_schedule

    ours = make_sampler("ddim", make_noise_schedule(DiffusionConfig()).config)  # what a trained model's folder holds
    ours.set_timesteps(4)
    assert ours.timesteps.tolist() == trail.timesteps.tolist()
    with pytest.raises(ValueError, match="timestep spacing"):
        make_sampler("ddim", DDPMScheduler().config, timestep_spacing="sideways")

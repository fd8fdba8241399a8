"""The UNet as a diffusers model: shapes, presets, pipelines, save/load, capture inside the network."""

from __future__ import annotations

import pytest
import torch
import yaml
from diffusers import DDIMPipeline, DDIMScheduler, DDPMPipeline, DDPMScheduler, DiffusionPipeline
from diffusers.models.unets.unet_2d import UNet2DOutput

import denoiser  # noqa: F401  (pipelines resolve denoiser.model.unet from sys.modules)
from denoiser import UNet, capture_attention
from tests.conftest import ROOT, TINY

CONFIGS = ROOT / "configs"


def n_params(m) -> int:
    return sum(p.numel() for p in m.parameters())


def test_default_is_small_cifar_model():
    with torch.device("meta"):
        unet = UNet()
    cfg = unet.config
    assert (cfg.sample_size, cfg.in_channels, cfg.out_channels) == (32, 3, 3)
    assert 16 in cfg.attention_resolutions and 8 in cfg.attention_resolutions and cfg.mid_attention
    assert 2e6 < n_params(unet) < 10e6


def test_ddpm_cifar10_preset_has_35_7m_parameters():
    raw = yaml.safe_load((CONFIGS / "ddpm-cifar10.yaml").read_text())
    with torch.device("meta"):
        unet = UNet(**raw["model"])
    assert abs(n_params(unet) - 35.7e6) < 0.1e6


@pytest.mark.parametrize("name", ["tiny", "cifar10-small", "cifar10-cpu", "ddpm-cifar10", "cifar10", "emoji", "emoji32"])
def test_presets_build_from_model_section(name):
    raw = yaml.safe_load((CONFIGS / f"{name}.yaml").read_text())
    with torch.device("meta"):
        unet = UNet(**raw["model"])
    for key, value in raw["model"].items():  # every preset key lands in the diffusers config as written
        got = unet.config[key]
        assert (list(got) if isinstance(got, (list, tuple)) else got) == value, key
    # the parameter counts the presets' comments and the README state
    stated = {"tiny": 0.70, "cifar10-small": 6.8, "ddpm-cifar10": 35.7, "cifar10": 6.8, "emoji": 7.5, "emoji32": 6.8}
    if name in stated:
        assert sum(p.numel() for p in unet.parameters()) / 1e6 == pytest.approx(stated[name], abs=0.05)


@pytest.mark.parametrize("timestep", [5, torch.tensor(5), torch.tensor([5]), torch.tensor([5, 5, 5])])
def test_timestep_forms_agree(tiny_unet, timestep):
    x = torch.randn(3, 3, 16, 16)
    ref = tiny_unet(x, torch.tensor([5, 5, 5])).sample
    out = tiny_unet(x, timestep)
    assert isinstance(out, UNet2DOutput)
    torch.testing.assert_close(out.sample, ref)
    assert tiny_unet(x, timestep, return_dict=False)[0].shape == (3, 3, 16, 16)


def test_per_sample_timesteps_differ(tiny_unet):
    x = torch.randn(2, 3, 16, 16)
    a = tiny_unet(x, torch.tensor([1, 900])).sample
    b = tiny_unet(x, torch.tensor([1, 1])).sample
    torch.testing.assert_close(a[0], b[0])
    assert not torch.allclose(a[1], b[1])


def test_class_conditioning():
    torch.manual_seed(0)
    unet = UNet(**TINY, num_class_embeds=3).eval()
    torch.nn.init.normal_(unet.class_embed.weight)
    x = torch.randn(2, 3, 16, 16)
    a = unet(x, 10, class_labels=torch.tensor([0, 1])).sample
    b = unet(x, 10, class_labels=torch.tensor([2, 1])).sample
    assert not torch.allclose(a[0], b[0])
    torch.testing.assert_close(a[1], b[1])
    unconditional = unet(x, 10).sample  # the extra "no class" row
    torch.testing.assert_close(unconditional, unet(x, 10, class_labels=torch.tensor([3, 3])).sample)
    with pytest.raises(ValueError, match="class_labels must lie"):
        unet(x, 10, class_labels=torch.tensor([0, 7]))


def test_channels_last_with_groupnorm_kernel_matches_default_layout(tiny_unet):
    # channels-last runs the NHWC GroupNorm+SiLU kernel; NCHW runs torch's GroupNorm and SiLU
    torch.manual_seed(1)
    x, t, noise = torch.randn(3, 3, 16, 16), torch.tensor([5, 500, 900]), torch.randn(3, 3, 16, 16)
    cl = UNet(**TINY)
    cl.load_state_dict(tiny_unet.state_dict())
    cl = cl.to(memory_format=torch.channels_last)
    grads = []
    for model, inp in ((tiny_unet, x), (cl, x.contiguous(memory_format=torch.channels_last))):
        model.zero_grad()
        out = model(inp, t).sample
        (out - noise).pow(2).mean().backward()
        grads.append((out.detach(), {n: p.grad for n, p in model.named_parameters()}))
    (out_a, ga), (out_b, gb) = grads
    torch.testing.assert_close(out_b, out_a, rtol=1e-4, atol=1e-5)
    for name in ga:
        torch.testing.assert_close(gb[name], ga[name], rtol=1e-3, atol=1e-5, msg=name)


def _cl_copy(unet: UNet) -> UNet:
    cl = UNet(**unet.config)
    cl.load_state_dict(unet.state_dict())
    return cl.eval().to(memory_format=torch.channels_last)


def test_the_network_is_torch_modules(tiny_unet):
    unet = _cl_copy(tiny_unet)
    model_files = {"denoiser.model.unet", "denoiser.model.attention", "denoiser.model.attention_blocks", "denoiser.model.groupnorm"}
    kinds = {type(m).__module__ for m in unet.modules()}
    assert all(k.startswith("torch.nn.") or k in model_files for k in kinds), kinds  # nothing of denoiser.fast
    with torch.inference_mode():
        out = unet(torch.randn(1, 3, 16, 16).contiguous(memory_format=torch.channels_last), 10).sample
    assert out.shape == (1, 3, 16, 16) and torch.isfinite(out).all()


def test_without_the_kernels_the_modules_run(tiny_unet, monkeypatch):
    from denoiser.fast import kernels
    from denoiser.sampling.loop import make_sampler, sample

    unet = _cl_copy(tiny_unet)
    x = torch.randn(2, 3, 16, 16).contiguous(memory_format=torch.channels_last)
    with torch.inference_mode():
        fast = unet(x, 10).sample
    monkeypatch.setattr(kernels, "_state", {"ok": False, "error": "no compiler"})
    with torch.inference_mode():
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            slow = unet(x, 10).sample
        assert not [e.key for e in prof.key_averages() if e.key.startswith("denoiser::")]
        torch.testing.assert_close(slow, fast, rtol=1e-4, atol=1e-5)  # torch's GroupNorm and SDPA
    assert sample(unet, make_sampler("ddim", {"num_train_timesteps": 1000}), 2, 2).images.shape == (2, 3, 16, 16)


def test_bad_sample_size_is_explained():
    with pytest.raises(ValueError, match="sample_size must be divisible by 4"):
        UNet(sample_size=30)


def test_capture_inside_unet_is_bit_identical_with_readable_names(tiny_unet):
    x = torch.randn(2, 3, 16, 16)
    plain = tiny_unet(x, 50).sample
    with capture_attention(tiny_unet) as records:
        captured = tiny_unet(x, 50).sample
    assert torch.equal(plain, captured)
    names = [r.name for r in records]
    assert names == ["down.1.attn.0", "mid_attn", "up.0.attn.0", "up.0.attn.1"]
    assert all(r.size == (8, 8) for r in records)
    w = records[0].weights((3, 4))
    assert w.shape == (2, 2, 8, 8)
    torch.testing.assert_close(w.sum((-2, -1)), torch.ones(2, 2))


def test_works_in_diffusers_pipelines(tiny_unet):
    for pipe in (DDPMPipeline(unet=tiny_unet, scheduler=DDPMScheduler()), DDIMPipeline(unet=tiny_unet, scheduler=DDIMScheduler())):
        pipe.set_progress_bar_config(disable=True)
        kwargs = {"num_inference_steps": 3} if isinstance(pipe, DDIMPipeline) else {"num_inference_steps": 3}
        images = pipe(batch_size=2, generator=torch.Generator().manual_seed(0), output_type="np", **kwargs).images
        assert images.shape == (2, 16, 16, 3)
        assert images.min() >= 0 and images.max() <= 1


def test_default_unet_in_ddpm_pipeline():
    pipe = DDPMPipeline(unet=UNet(), scheduler=DDPMScheduler())
    pipe.set_progress_bar_config(disable=True)
    out = pipe(batch_size=1, num_inference_steps=2, generator=torch.Generator().manual_seed(0), output_type="np")
    assert out.images.shape == (1, 32, 32, 3)


def test_save_load_identical_and_safetensors_only(tiny_unet, tmp_path):
    tiny_unet.save_pretrained(tmp_path / "unet")
    files = {p.name for p in (tmp_path / "unet").iterdir()}
    assert "diffusion_pytorch_model.safetensors" in files and not any(f.endswith(".bin") for f in files)
    loaded = UNet.from_pretrained(tmp_path / "unet").eval()
    x = torch.randn(2, 3, 16, 16)
    assert torch.equal(tiny_unet(x, 7).sample, loaded(x, 7).sample)


def test_saved_pipeline_reloads_with_diffusion_pipeline(tiny_unet, tmp_path):
    DDPMPipeline(unet=tiny_unet, scheduler=DDPMScheduler()).save_pretrained(tmp_path / "pipe")
    pipe = DiffusionPipeline.from_pretrained(tmp_path / "pipe")
    assert isinstance(pipe, DDPMPipeline) and isinstance(pipe.unet, UNet)
    saved, loaded = tiny_unet.state_dict(), pipe.unet.state_dict()
    assert saved.keys() == loaded.keys() and all(torch.equal(saved[k], loaded[k]) for k in saved)  # exact round trip
    assert all(p.data_ptr() % 64 == 0 for p in pipe.unet.parameters())  # realigned (UNet.from_pretrained)
    x = torch.randn(1, 3, 16, 16)
    torch.testing.assert_close(pipe.unet(x, 3).sample, tiny_unet(x, 3).sample, rtol=1e-5, atol=1e-6)

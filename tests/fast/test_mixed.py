"""The per-op bfloat16 mix (denoiser.fast.mixed): each product in bf16 is at most about as wrong as torch's own bf16
against float64 (flash-attention's rule: at most ~2x), the rest stays float32, outside the mix every swapped module is
torch's own, and attention is captured exactly in float32 inside a mixed run."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from denoiser.fast import batch_invariant, mixed, winograd
from denoiser.fast.precision import choose_precision, running
from denoiser.model.attention_capture import capture_attention
from denoiser.sampling.loop import sampling_context
from tests.conftest import needs_kernels


def _max_err(a: torch.Tensor, ref: torch.Tensor) -> float:
    return float((a.double() - ref).abs().max())


@needs_kernels
@pytest.mark.parametrize("C, K, H", [(64, 64, 32), (256, 128, 16), (128, 128, 8), (48, 80, 13)])
def test_winograd_bf16_products_err_about_as_torchs_bf16_convolution(C, K, H):
    g = torch.Generator().manual_seed(C + K + H)
    conv = nn.Conv2d(C, K, 3, padding=1).eval()
    x = torch.randn(3, C, H, H, generator=g).contiguous(memory_format=torch.channels_last)
    winograd.use_winograd(conv)
    with torch.inference_mode():
        ref = F.conv2d(x.double(), conv.weight.double(), conv.bias.double(), padding=1)
        with winograd.bf16_products():
            ours = conv(x)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            torchs = F.conv2d(x, conv.weight, conv.bias, padding=1)
    assert ours.dtype == torch.float32 and conv._transformed[1][torch.bfloat16].dtype == torch.bfloat16  # it ran in bf16
    err, torch_err, scale = _max_err(ours, ref), _max_err(torchs, ref), float(ref.abs().max())
    # F(4x4, 3x3) is ill-conditioned in low precision: rounding V, U or M to bf16 each costs ~6 % of the output's
    # scale on random weights (an emulation in float64), ~20-30x torch's bf16 convolution a layer
    # (bench/precision_mix.md); the trained UNet's predicted noise stays within 2x bf16 autocast's (the test below)
    assert 0 < err <= 0.15 * scale and err <= 40 * torch_err, (err, torch_err, scale)


def test_linear_and_1x1_convolution_err_about_as_torchs_bf16_and_are_torchs_outside_the_mix():
    g = torch.Generator().manual_seed(0)
    lin, conv = nn.Linear(96, 80).eval(), nn.Conv2d(96, 80, 1).eval()
    tokens = torch.randn(2, 50, 96, generator=g)
    pixels = torch.randn(2, 96, 7, 9, generator=g).contiguous(memory_format=torch.channels_last)
    with torch.inference_mode():
        plain = lin(tokens), conv(pixels)
        mixed.use_mixed(lin)
        mixed.use_mixed(conv)
        assert type(lin) is mixed.Linear and type(conv) is mixed.Conv1x1
        assert torch.equal(lin(tokens), plain[0]) and torch.equal(conv(pixels), plain[1])  # outside on(): torch's
        with mixed.on():
            ours = lin(tokens), conv(pixels)
            by_row = lin(tokens[0])  # (N, C) rows, the timestep path's shape: float32
        with torch.autocast("cpu", dtype=torch.bfloat16):
            torchs = lin(tokens), conv(pixels)
    assert torch.equal(by_row, batch_invariant.rows(tokens[0], lin.weight, lin.bias))  # the timestep path's rows: float32, row by row
    assert ours[1].is_contiguous(memory_format=torch.channels_last)
    refs = (F.linear(tokens.double(), lin.weight.double(), lin.bias.double()),
            F.conv2d(pixels.double(), conv.weight.double(), conv.bias.double()))
    for a, t, ref in zip(ours, torchs, refs):
        assert a.dtype == torch.float32 and 0 < _max_err(a, ref) <= 2 * _max_err(t, ref)


def test_a_mixed_unet_predicts_the_noise_within_bf16_error_and_captures_float32_attention(tiny_unet):
    g = torch.Generator().manual_seed(2)
    x, t = torch.randn(2, 3, 16, 16, generator=g).contiguous(memory_format=torch.channels_last), torch.tensor([10, 700])
    with torch.inference_mode():
        ref = tiny_unet.double()(x.double(), t).sample
        tiny_unet.float()
        with running(choose_precision(tiny_unet, "float32")), sampling_context(tiny_unet), capture_attention(tiny_unet) as f32:
            plain = tiny_unet(x, t).sample
        with running(choose_precision(tiny_unet, "mixed")), sampling_context(tiny_unet):
            fast = tiny_unet(x, t).sample
            with capture_attention(tiny_unet) as under_mix:
                tiny_unet(x, t)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            autocast = tiny_unet(x, t).sample
    assert fast.dtype == torch.float32
    err = _max_err(fast, ref)
    # it ran the mix, and stays close: on this tiny model's random weights Winograd's bf16 products cost more than
    # autocast's rounding (~6x); on the shipped models the predicted noise is within 1.2x autocast's (bench/precision_mix.md)
    assert _max_err(plain, ref) < 1e-4 < err <= 10 * _max_err(autocast, ref) and err < 0.1 * float(ref.abs().max())
    assert len(f32) == len(under_mix) > 0
    for a, b in zip(f32, under_mix):
        assert torch.equal(a.q, b.q) and torch.equal(a.k, b.k)


def test_a_plan_names_the_mix_it_runs(tmp_path, tiny_unet):
    from diffusers import DDPMScheduler

    from denoiser.request import SampleRequest
    from denoiser.sampling.pipeline import save_pipeline
    from denoiser.sampling.plan import resolve, run

    folder = save_pipeline(tiny_unet, DDPMScheduler(), tmp_path / "model")
    plan = resolve(SampleRequest(num_images=2, steps=2, precision="mixed"), folder)
    assert plan.precision.name == "mixed" and plan.describe().endswith("mixed (mixed was asked for)")
    mixed_images = run(plan).images
    f32 = run(resolve(SampleRequest(num_images=2, steps=2, precision="float32"), folder)).images
    assert 0 < float((mixed_images - f32).abs().max()) < 0.25  # a tiny random model: its pixels, not its quality

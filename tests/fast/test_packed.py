"""bf16 autocast's weights kept once (denoiser.fast.packed): the same numbers as autocast's per-call casts, bit for
bit, converted once per version of the weight, and torch's own modules everywhere else."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from denoiser.fast import batch_invariant, mixed, packed, winograd
from denoiser.model.unet import UNet
from denoiser.sampling.loop import sampling_context


def _bf16():
    return torch.autocast("cpu", dtype=torch.bfloat16)


def _swap(module: nn.Module) -> nn.Module:
    """What the sampling doors swap in (`sampling_context`): every convolution and linear layer a packed subclass."""
    winograd.use_winograd(module)
    batch_invariant.use_batch_invariant(module)
    mixed.use_mixed(module)
    return module


@pytest.mark.parametrize("conv", [nn.Conv2d(64, 32, 3, padding=1), nn.Conv2d(16, 24, 3, stride=2, padding=1),
                                  nn.Conv2d(32, 48, 1), nn.Conv2d(3, 64, 3, padding=1, bias=False)])
def test_convolution_under_bf16_autocast_is_autocasts_bit_for_bit(conv):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, conv.in_channels, 12, 12, generator=g).contiguous(memory_format=torch.channels_last)
    ours = _swap(copy.deepcopy(conv).eval())
    assert isinstance(ours, packed.Conv2d)
    with torch.inference_mode(), _bf16():
        want = conv(x)
        got = ours(x)
        assert "packed" in ours._kept()  # it took the packed path
        again = ours(x[:1])  # another batch size: the same packed weight
    assert got.dtype == want.dtype == torch.bfloat16 and got.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(got, want) and torch.equal(again, want[:1])


def test_linear_under_bf16_autocast_is_autocasts_bit_for_bit():
    g = torch.Generator().manual_seed(1)
    lin = nn.Linear(40, 24).eval()
    ours = _swap(copy.deepcopy(lin))
    assert isinstance(ours, packed.Linear)
    for x in (torch.randn(2, 7, 40, generator=g), torch.randn(5, 40, generator=g)):  # tokens, and the timestep rows
        with torch.inference_mode(), _bf16():
            assert torch.equal(ours(x), lin(x))


def test_weights_are_converted_once_per_version_of_the_weight():
    conv = _swap(nn.Conv2d(8, 8, 3, padding=1).eval())
    x = torch.randn(2, 8, 6, 6).contiguous(memory_format=torch.channels_last)
    with torch.no_grad(), _bf16():
        conv(x)
        first = conv._kept()["packed"]
        conv(x)
        assert conv._kept()["packed"] is first  # kept: not converted again
        conv.weight.mul_(2)  # changed in place (an EMA copy, load_state_dict): a new version
        conv(x)
        assert conv._kept()["packed"] is not first
    with torch.no_grad():
        plain = nn.Conv2d(8, 8, 3, padding=1)
        plain.load_state_dict(conv.state_dict())
        with _bf16():
            assert torch.equal(conv(x), plain(x))  # the doubled weight is the one used


def test_outside_bf16_autocast_inference_the_modules_are_torchs():
    g = torch.Generator().manual_seed(2)
    conv = nn.Conv2d(16, 16, 1)
    ours = _swap(copy.deepcopy(conv))
    x = torch.randn(2, 16, 5, 5, generator=g)
    with torch.inference_mode():
        assert torch.equal(ours(x), conv(x))  # float32: torch's
        with _bf16():
            assert torch.equal(ours(x), conv(x))  # NCHW: torch's (oneDNN packs another algorithm for it)
            assert "packed" not in ours._kept()
        with torch.autocast("cpu", dtype=torch.float16):
            assert torch.equal(ours(x.contiguous(memory_format=torch.channels_last)), conv(x.contiguous(memory_format=torch.channels_last)))
    xg = x.contiguous(memory_format=torch.channels_last).requires_grad_()
    with _bf16():
        ours(xg).float().sum().backward()  # training: autocast's own path, which has a backward
    assert xg.grad is not None and "packed" not in ours._kept()


def test_a_whole_unet_under_bf16_autocast_is_autocasts_and_the_switch_turns_it_off():
    torch.manual_seed(0)
    unet = UNet(sample_size=16, base_channels=32, channel_mult=(1, 2), attention_resolutions=(8,), num_heads=2,
                norm_num_groups=8).eval()
    plain = copy.deepcopy(unet)
    x = torch.randn(3, 3, 16, 16).contiguous(memory_format=torch.channels_last)
    t = torch.tensor([10, 500, 900])
    with torch.inference_mode():
        with _bf16():
            want = plain(x, t).sample
        with sampling_context(unet), _bf16():  # the doors' swap
            got = unet(x, t).sample
            with packed.switched(False):
                unswitched = unet(x, t).sample
    kept = [m for m in unet.modules() if isinstance(m, (nn.Conv2d, nn.Linear))]
    assert kept and all(isinstance(m, (packed.Conv2d, packed.Linear)) for m in kept)
    assert any("packed" in m._kept() for m in kept if isinstance(m, packed.Conv2d))
    assert torch.equal(got, want) and torch.equal(unswitched, want)

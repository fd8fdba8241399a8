"""denoiser.fast.winograd: 3x3 convolutions by Winograd's F(4x4, 3x3) compute nn.Conv2d's function (against float64),
take only what they cover, and follow a weight changed in place."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from denoiser.fast import winograd
from denoiser.fast.winograd import Conv2d, transform_weight, use_winograd
from tests.conftest import TINY, needs_kernels

# Winograd's float32 error is about 8x direct convolution's (the transforms' constants, up to 8): measured
# 2e-6..6e-6 of the output's largest value on these shapes, against 4e-7..9e-7 for torch's own convolution
RELATIVE_BOUND = 2e-5


def _conv(c_in: int, c_out: int, bias: bool = True, seed: int = 0) -> nn.Conv2d:
    torch.manual_seed(seed)
    conv = nn.Conv2d(c_in, c_out, 3, padding=1, bias=bias)
    use_winograd(conv)
    return conv


def _x(*shape: int, scale: float = 1.0, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (scale * torch.randn(*shape, generator=g)).contiguous(memory_format=torch.channels_last)


def _relative_error(y: torch.Tensor, conv: nn.Conv2d, x: torch.Tensor) -> float:
    bias = None if conv.bias is None else conv.bias.double()
    ref = F.conv2d(x.double(), conv.weight.double(), bias, padding=1)
    return ((y.double() - ref).abs().max() / ref.abs().max()).item()


@needs_kernels
@pytest.mark.parametrize(
    "batch, c_in, height, width, c_out, bias",
    [
        (2, 16, 32, 32, 16, True),  # whole tiles
        (3, 20, 9, 13, 17, True),  # partial tiles at both edges; channels not a multiple of 16
        (1, 64, 1, 1, 48, False),  # one pixel: a tile that is nearly all padding
        (2, 33, 2, 7, 16, True),
        (1, 128, 8, 8, 128, True),  # the shipped models' smallest maps
        (4, 16, 5, 4, 64, False),
    ],
)
def test_matches_a_float64_convolution(batch, c_in, height, width, c_out, bias):
    conv = _conv(c_in, c_out, bias)
    x = _x(batch, c_in, height, width)
    with torch.inference_mode():
        y = conv(x)
    assert conv._transformed is not None, "the Winograd kernel did not run"
    assert y.shape == (batch, c_out, height, width) and y.is_contiguous(memory_format=torch.channels_last)
    assert _relative_error(y, conv, x) <= RELATIVE_BOUND


@needs_kernels
@pytest.mark.parametrize("scale", [1e-3, 1e3])
def test_error_is_relative_to_the_values(scale):
    conv = _conv(32, 32)
    x = _x(2, 32, 12, 12, scale=scale)
    with torch.inference_mode():
        y = conv(x)
    assert _relative_error(y, conv, x) <= RELATIVE_BOUND


@needs_kernels
def test_a_weight_changed_in_place_is_transformed_again():
    conv = _conv(16, 16)
    x = _x(1, 16, 8, 8)
    with torch.inference_mode():
        before = conv(x)
    with torch.no_grad():
        conv.weight.mul_(-2.0)  # as an optimizer step or an EMA copy changes it
    with torch.inference_mode():
        after = conv(x)
    assert _relative_error(after, conv, x) <= RELATIVE_BOUND
    other = _conv(16, 16, seed=7)
    conv.load_state_dict(other.state_dict())
    with torch.inference_mode():
        loaded = conv(x)
    assert _relative_error(loaded, other, x) <= RELATIVE_BOUND
    assert not torch.allclose(before, after) and not torch.allclose(after, loaded)


def test_what_it_does_not_cover_runs_torchs_convolution_exactly():
    conv = _conv(16, 16)
    x = _x(2, 16, 8, 8)
    plain = lambda inp: F.conv2d(inp, conv.weight, conv.bias, padding=1)  # noqa: E731
    assert torch.equal(conv(x), plain(x))  # autograd on: training
    with torch.no_grad():
        nchw = x.contiguous()
        assert torch.equal(conv(nchw), plain(nchw))  # not channels-last
        double = _conv(16, 16).double()  # float64
        xd = x.double()
        assert torch.equal(double(xd), F.conv2d(xd, double.weight, double.bias, padding=1))
        with torch.autocast("cpu", dtype=torch.bfloat16):  # bf16 autocast: torch's convolution
            assert torch.equal(conv(x), plain(x))
    assert conv._transformed is None and double._transformed is None


def test_switched_off_by_its_variable(monkeypatch):
    monkeypatch.setenv(winograd.WINOGRAD_ENV, "0")
    conv = _conv(16, 16)
    x = _x(1, 16, 8, 8)
    with torch.inference_mode():
        assert torch.equal(conv(x), F.conv2d(x, conv.weight, conv.bias, padding=1))
    assert not winograd.winograd_kernel() and conv._transformed is None


def test_use_winograd_swaps_the_eligible_convolutions_only():
    class Mine(nn.Conv2d):
        pass

    convs = nn.ModuleDict({
        "yes": nn.Conv2d(16, 32, 3, padding=1),
        "no_bias": nn.Conv2d(32, 16, 3, padding=1, bias=False),
        "strided": nn.Conv2d(16, 16, 3, stride=2, padding=1),
        "one_by_one": nn.Conv2d(16, 16, 1),
        "rgb_in": nn.Conv2d(3, 16, 3, padding=1),
        "rgb_out": nn.Conv2d(16, 3, 3, padding=1),
        "grouped": nn.Conv2d(16, 16, 3, padding=1, groups=2),
        "dilated": nn.Conv2d(16, 16, 3, padding=2, dilation=2),
        "reflect": nn.Conv2d(16, 16, 3, padding=1, padding_mode="reflect"),
        "subclass": Mine(16, 16, 3, padding=1),
    })  # fmt: skip
    keys = list(convs.state_dict())
    use_winograd(convs)
    use_winograd(convs)  # twice: a no-op
    swapped = {name for name, m in convs.items() if type(m) is Conv2d}
    assert swapped == {"yes", "no_bias"}
    assert list(convs.state_dict()) == keys and isinstance(convs["yes"], nn.Conv2d)


def test_transform_weight_is_g_g_gt():
    w = torch.randn(5, 3, 3, 3, dtype=torch.float64)
    u = transform_weight(w)  # (36, C, K)
    G = torch.tensor(winograd._G, dtype=torch.float64)
    k, c = 4, 2
    expected = G @ w[k, c] @ G.T  # (6, 6)
    assert u.shape == (36, 3, 5) and u.dtype == torch.float32
    assert torch.allclose(u[:, c, k].double().view(6, 6), expected, rtol=1e-6, atol=1e-7)


@needs_kernels
def test_a_sampling_call_of_the_unet_agrees_with_direct_convolution():
    from denoiser.model.unet import UNet
    from denoiser.sampling.loop import sampling_context

    torch.manual_seed(0)
    unet = UNet(**{**TINY, "num_class_embeds": 3}).eval()
    x = _x(2, 3, 16, 16)
    args = dict(timestep=torch.tensor([10, 700]), class_labels=torch.tensor([0, 2]))
    with torch.inference_mode():
        direct = unet(x, **args).sample
        with sampling_context(unet):
            fast = unet(x, **args).sample
    assert sum(type(m) is Conv2d for m in unet.modules()) >= 4
    assert all(m._transformed is not None for m in unet.modules() if type(m) is Conv2d)
    assert (fast - direct).abs().max().item() <= 1e-4 * direct.abs().max().item()

"""prepacked: a model's nn.Conv2d on a weight packed once for oneDNN, the same function."""

from __future__ import annotations

import threading

import pytest
import torch
from torch import nn

from denoiser.fast.conv import Conv2d, can_prepack, prepacked

pytestmark = pytest.mark.skipif(not can_prepack(), reason="this torch has no oneDNN (mkldnn) CPU backend")


def channels_last(x: torch.Tensor) -> torch.Tensor:
    return x.contiguous(memory_format=torch.channels_last)


def pointwise_calls(fn) -> int:
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fn()
    return sum(e.count for e in prof.key_averages() if e.key == "mkldnn::_convolution_pointwise")


@pytest.mark.parametrize(
    "cin,cout,kernel,stride,padding,size",
    [(3, 16, 3, 1, 1, (13, 7)), (16, 32, 1, 1, 0, (8, 8)), (24, 24, 3, 2, 1, (9, 11)), (8, 8, 3, 1, 1, (1, 1))],
)
def test_packed_convolution_matches_float64(cin, cout, kernel, stride, padding, size):
    torch.manual_seed(cin)
    conv = Conv2d(cin, cout, kernel, stride=stride, padding=padding)
    x = channels_last(torch.randn(3, cin, *size))
    ref = nn.functional.conv2d(x.double(), conv.weight.double(), conv.bias.double(), stride, padding)
    with torch.inference_mode():
        plain = conv(x)
        with prepacked([conv]):
            assert pointwise_calls(lambda: conv(x)) == 1
            packed = conv(x)
    assert packed.shape == plain.shape and packed.is_contiguous(memory_format=torch.channels_last)
    torch_err = (plain.double() - ref).abs().max().item()
    assert (packed.double() - ref).abs().max().item() <= 2 * torch_err + 1e-6


def test_a_torch_conv_is_swapped_in_place_and_computes_as_before_outside():
    torch.manual_seed(2)
    conv, subclass = nn.Conv2d(8, 8, 3, padding=1), type("LoRAConv", (nn.Conv2d,), {})(8, 8, 3, padding=1)
    params, calls = list(conv.parameters()), []
    conv.register_forward_hook(lambda m, i, o: calls.append(1))
    x = channels_last(torch.randn(2, 8, 6, 6))
    with torch.inference_mode():
        plain = conv(x)
        with prepacked([conv, subclass]):
            assert pointwise_calls(lambda: conv(x)) == 1
            assert pointwise_calls(lambda: subclass(x)) == 0  # another subclass keeps its own forward
            torch.testing.assert_close(conv(x), plain, rtol=1e-5, atol=1e-5)
        assert type(conv) is Conv2d and list(conv.parameters()) == params and len(calls) == 3  # the same module
        assert pointwise_calls(lambda: conv(x)) == 0 and torch.equal(conv(x), plain)  # nn.Conv2d's forward again


def test_only_inference_on_channels_last_fp32_takes_the_packed_weight():
    conv, conv64 = Conv2d(8, 8, 3, padding=1), Conv2d(8, 8, 3, padding=1).double()
    x = channels_last(torch.randn(2, 8, 6, 6))
    with prepacked([conv, conv64]):
        with torch.inference_mode():
            assert pointwise_calls(lambda: conv(x.contiguous())) == 0  # NCHW
            assert pointwise_calls(lambda: conv64(x.double())) == 0  # another dtype
        y = conv(x.requires_grad_())  # autograd: the module's forward, differentiable
        y.sum().backward()
        assert conv.weight.grad is not None and not conv._packed
    assert conv._packed is None


def test_weights_changed_after_leaving_are_used():
    conv = Conv2d(4, 4, 3, padding=1)
    x = channels_last(torch.randn(1, 4, 5, 5))
    with torch.inference_mode():
        with prepacked([conv]):
            before = conv(x)
        with torch.no_grad():
            conv.weight.mul_(2)
            conv.bias.mul_(2)
        with prepacked([conv]):
            torch.testing.assert_close(conv(x), 2 * before, rtol=1e-5, atol=1e-5)


def test_threads_share_packs_and_the_last_one_out_drops_them():
    conv = Conv2d(16, 16, 3, padding=1)
    xs = [channels_last(torch.randn(b, 16, 8, 8)) for b in (1, 2, 3, 4)]
    with torch.inference_mode():
        refs = [conv(x) for x in xs]
    inside, errors = threading.Barrier(len(xs)), []

    def work(i):
        try:
            with torch.inference_mode(), prepacked([conv]):
                inside.wait(timeout=30)  # all four open at once
                for _ in range(5):
                    torch.testing.assert_close(conv(xs[i]), refs[i], rtol=1e-5, atol=1e-5)
                inside.wait(timeout=30)
        except Exception as e:  # noqa: BLE001  (reported below)
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(xs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert conv._packed is None and conv._users == 0


def test_state_dict_is_nn_conv2d():
    plain = nn.Conv2d(3, 5, 3, padding=1)
    conv = Conv2d(3, 5, 3, padding=1)
    conv.load_state_dict(plain.state_dict())
    assert set(conv.state_dict()) == {"weight", "bias"}
    x = torch.randn(2, 3, 7, 7)
    assert torch.equal(conv(x), plain(x))

"""The channels-last GroupNorm(+SiLU) kernel against its reference, F.group_norm (+ F.silu), in float64."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from denoiser.fast import kernels
from denoiser.fast.groupnorm import default_channels_last
from denoiser.fast.kernels import load_kernels
from denoiser.model.groupnorm import GroupNorm, group_norm
from tests.conftest import needs_kernels

# awkward shapes: 1 channel per group, odd and non-square sizes, pixel counts that are not a multiple
# of the kernel's 64-pixel chunks, a batch of one
SHAPES = [(3, 64, 7, 5), (2, 32, 16, 16), (1, 128, 8, 8), (4, 96, 33, 3), (2, 64, 1, 1), (5, 32, 13, 11)]


def channels_last(x: torch.Tensor) -> torch.Tensor:
    return x.contiguous(memory_format=torch.channels_last)


def reference(x, w, b, silu, groups=32):
    y = F.group_norm(x, groups, w, b, 1e-6)
    return F.silu(y) if silu else y


def run(x, w, b, silu, fast, grad_out):
    """Output and (dx, dw, db) of group_norm, computed in x's dtype."""
    x, w, b = (t.detach().clone().requires_grad_(True) for t in (x, w, b))
    y = group_norm(x, 32, w, b, 1e-6, silu=silu, fast=fast)
    y.backward(grad_out.to(y.dtype))
    return y.detach(), (x.grad, w.grad, b.grad)


def rel_err(a: torch.Tensor, ref: torch.Tensor) -> float:
    return ((a.double() - ref).abs().max() / ref.abs().max().clamp_min(1e-12)).item()


@needs_kernels
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("silu", [False, True])
def test_fp32_forward_and_backward_match_float64(shape, silu):
    torch.manual_seed(0)
    C = shape[1]
    x = channels_last(torch.randn(shape) * 2 + 3)
    w, b, g = torch.randn(C), torch.randn(C), channels_last(torch.randn(shape))
    y, grads = run(x, w, b, silu, fast=True, grad_out=g)
    assert y.is_contiguous(memory_format=torch.channels_last) and y.dtype == torch.float32
    y_ref, grads_ref = run(x.double(), w.double(), b.double(), silu, fast=False, grad_out=g.double())
    y_torch, grads_torch = run(x.contiguous(), w, b, silu, fast=False, grad_out=g.contiguous())
    # fp32 accuracy, or within 2x of torch's own fp32 error where the problem is ill-conditioned
    # (a 1x1 map: two values per group)
    assert rel_err(y, y_ref) <= max(2e-6, 2 * rel_err(y_torch, y_ref))
    for got, theirs, want in zip(grads, grads_torch, grads_ref):
        assert rel_err(got, want) <= max(2e-6, 2 * rel_err(theirs, want))


@needs_kernels
@pytest.mark.parametrize("shape", [(4, 128, 16, 16), (3, 64, 7, 5)])
@pytest.mark.parametrize("silu", [False, True])
def test_bf16_error_at_most_twice_torchs_own(shape, silu):
    # the flash-attention criterion: in bf16 the kernel may be at most ~2x as wrong as torch itself
    torch.manual_seed(0)
    C = shape[1]
    x = (torch.randn(shape) * 2 + 3).bfloat16()
    w, b, g = torch.randn(C), torch.randn(C), torch.randn(shape).bfloat16()
    y_ref, grads_ref = run(x.double(), w.double(), b.double(), silu, fast=False, grad_out=g.double())
    y, grads = run(channels_last(x), w, b, silu, fast=True, grad_out=channels_last(g))
    with torch.autocast("cpu", dtype=torch.bfloat16):  # torch's bf16 path, as the U-Net meets it
        y_torch, grads_torch = run(x, w, b, silu, fast=False, grad_out=g)
    assert y.dtype == torch.bfloat16 and grads[0].dtype == torch.bfloat16 and grads[1].dtype == torch.float32
    assert rel_err(y, y_ref) <= 2 * rel_err(y_torch, y_ref) + 1e-6
    for got, theirs, want in zip(grads, grads_torch, grads_ref):
        assert rel_err(got, want) <= 2 * rel_err(theirs, want) + 1e-6


@needs_kernels
def test_large_mean_does_not_cancel_the_variance():
    # statistics from shifted sums: a mean 1000x the spread still normalises to fp32 accuracy
    torch.manual_seed(0)
    x = channels_last(torch.randn(2, 64, 8, 8) + 1000.0)
    w, b = torch.ones(64), torch.zeros(64)
    y = group_norm(x, 32, w, b, 1e-6, fast=True)
    y_ref = F.group_norm(x.double(), 32, w.double(), b.double(), 1e-6)
    assert (y.double() - y_ref).abs().max().item() < 1e-3  # x itself carries ~6e-5 rounding at 1000


@needs_kernels
def test_nan_propagates_only_within_its_group():
    x = channels_last(torch.randn(2, 64, 4, 4))
    x[0, 5, 1, 1] = float("nan")  # channel 5 is in group 2 (2 channels per group)
    y = group_norm(x, 32, torch.ones(64), torch.zeros(64), 1e-6, silu=True, fast=True)
    assert torch.isnan(y[0, 4:6]).all()
    assert torch.isfinite(y[0, :4]).all() and torch.isfinite(y[0, 6:]).all() and torch.isfinite(y[1]).all()


@needs_kernels
def test_results_do_not_depend_on_threads_or_batch():
    torch.manual_seed(0)
    x = channels_last(torch.randn(4, 64, 16, 16))
    w, b = torch.randn(64), torch.randn(64)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = group_norm(x, 32, w, b, 1e-6, silu=True, fast=True)
        torch.set_num_threads(2)
        two = group_norm(x, 32, w, b, 1e-6, silu=True, fast=True)
        single = group_norm(x[2:3], 32, w, b, 1e-6, silu=True, fast=True)  # fewer images than threads
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(one, two)
    assert torch.equal(single, two[2:3])


@needs_kernels
def test_module_dispatch_and_state_dict():
    torch.manual_seed(0)
    plain = nn.GroupNorm(8, 32, eps=1e-6)
    nn.init.normal_(plain.weight)
    norm = GroupNorm(8, 32, eps=1e-6, silu=True)
    norm.load_state_dict(plain.state_dict())  # same keys: existing checkpoints load
    assert set(norm.state_dict()) == {"weight", "bias"}
    x = torch.randn(2, 32, 6, 6)
    # NCHW: the reference path exactly; channels-last: the kernel, same function
    assert torch.equal(norm(x), F.silu(plain(x)))
    y_cl = norm(channels_last(x))
    assert y_cl.is_contiguous(memory_format=torch.channels_last)
    torch.testing.assert_close(y_cl, F.silu(plain(x)), rtol=1e-5, atol=1e-6)
    assert "silu=True" in repr(norm)


def test_fallback_when_the_kernel_is_unavailable(monkeypatch):
    monkeypatch.setattr(kernels, "_state", {"ok": False, "error": "no compiler"})
    x = channels_last(torch.randn(2, 32, 4, 4))
    w, b = torch.randn(32), torch.randn(32)
    assert torch.equal(group_norm(x, 8, w, b, 1e-6, silu=True), F.silu(F.group_norm(x, 8, w, b, 1e-6)))
    with pytest.raises(RuntimeError, match="no compiler"):
        group_norm(x, 8, w, b, 1e-6, fast=True)
    assert default_channels_last("cpu", "bf16") is False  # torch's NHWC GroupNorm is slow in bf16
    assert default_channels_last("cpu", "no") is True


@needs_kernels
def test_default_layout_per_precision():
    assert default_channels_last("cpu", "bf16") is True  # the kernel is built here
    assert default_channels_last("cpu", "fp16") is False  # not covered by the kernel
    assert default_channels_last("cuda", "fp16") is True


@needs_kernels
def test_transforms_and_higher_order_gradients_match_the_reference():
    # vmap, torch.func.grad/jvp, forward-mode AD and double backward take the reference path (the
    # kernel has no rules for them) instead of silently returning zeros
    from torch.func import grad, jvp, vmap

    torch.manual_seed(0)
    x, tangent = channels_last(torch.randn(2, 32, 8, 8)), channels_last(torch.randn(2, 32, 8, 8))
    w, b = torch.randn(32), torch.randn(32)

    def ours(a):
        return group_norm(a, 8, w, b, 1e-6, silu=True)

    def ref(a):
        return F.silu(F.group_norm(a, 8, w, b, 1e-6))

    jvp_ref = jvp(ref, (x,), (tangent,))[1]
    torch.testing.assert_close(jvp(ours, (x,), (tangent,))[1], jvp_ref)
    torch.testing.assert_close(grad(lambda a: ours(a).sum())(x), grad(lambda a: ref(a).sum())(x))
    torch.testing.assert_close(vmap(ours)(x[:, None])[:, 0], ref(x))
    with torch.autograd.forward_ad.dual_level():
        out = ours(torch.autograd.forward_ad.make_dual(x, tangent))
        torch.testing.assert_close(torch.autograd.forward_ad.unpack_dual(out).tangent, jvp_ref)
    second = []
    for fn in (ours, ref):  # the kernel's first backward, differentiated again
        a = x.clone().requires_grad_(True)
        (g,) = torch.autograd.grad(fn(a).pow(2).sum(), a, create_graph=True)
        second.append(torch.autograd.grad(g.pow(2).sum(), a)[0])
    torch.testing.assert_close(second[0], second[1], rtol=1e-4, atol=1e-4)


@needs_kernels
def test_outlier_in_the_first_pixel_keeps_fp32_accuracy():
    # review finding: statistics must not be taken around a single pixel
    torch.manual_seed(0)
    x = torch.randn(1, 32, 64, 64)
    x[:, :, 0, 0] = 30.0
    w, b = torch.ones(32), torch.zeros(32)
    y_ref = F.group_norm(x.double(), 32, w.double(), b.double(), 1e-6)
    y_torch = F.group_norm(x, 32, w, b, 1e-6)
    y = group_norm(channels_last(x), 32, w, b, 1e-6, fast=True)
    assert rel_err(y, y_ref) <= max(1e-6, 2 * rel_err(y_torch, y_ref))


@needs_kernels
def test_backward_op_checks_its_arguments():
    load_kernels()
    x = channels_last(torch.randn(2, 32, 8, 8))
    w, b = torch.ones(32), torch.zeros(32)
    with pytest.raises(RuntimeError, match="dy must have x's shape"):
        torch.ops.denoiser.group_norm_nhwc_backward(
            channels_last(torch.randn(1, 32, 8, 8)), x, w, b, torch.zeros(2, 8), torch.ones(2, 8), 8, True
        )
    with pytest.raises(RuntimeError, match="mean and rstd"):
        torch.ops.denoiser.group_norm_nhwc_backward(x, x, w, b, torch.zeros(1, 8), torch.ones(1, 8), 8, True)

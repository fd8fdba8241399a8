"""GroupNorm(+SiLU) for channels-last CPU tensors (`csrc/group_norm_nhwc.cpp`), forward and backward.

torch's own GroupNorm is 3-12x slower for channels-last tensors than for NCHW (bf16 especially) while the
convolutions around it are fastest channels-last; this kernel closes that gap. `denoiser.model.groupnorm`
calls `group_norm_nhwc` where `applies` says so and `F.group_norm` (+ `F.silu`) everywhere else; tests
assert both compute the same function, forward and backward (tests/fast/test_groupnorm.py).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from denoiser.fast.kernels import kernel_error, load_kernels, plain_tensors, tracing

__all__ = ["applies", "group_norm_nhwc", "default_channels_last"]


def default_channels_last(device: torch.device | str, mixed_precision: str = "no") -> bool:
    """Whether to train channels-last: convolutions are faster that way everywhere, but on CPU only where
    the GroupNorm kernel covers the activations' dtype (fp32, bf16); torch's own NHWC GroupNorm is
    several times slower in bf16/fp16 and would eat the gain."""
    if torch.device(device).type != "cpu":
        return True
    if mixed_precision == "no":
        return True
    return mixed_precision == "bf16" and load_kernels()


class _GroupNormNHWC(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, groups: int, eps: float, silu: bool):
        y, mean, rstd = torch.ops.denoiser.group_norm_nhwc_forward(x, weight, bias, groups, eps, silu)
        ctx.save_for_backward(x, weight, bias, mean, rstd)
        ctx.groups, ctx.silu, ctx.eps = groups, silu, eps
        return y

    @staticmethod
    def backward(ctx, dy):
        x, weight, bias, mean, rstd = ctx.saved_tensors
        if torch.is_grad_enabled():  # create_graph=True: differentiate the reference so higher orders work
            inputs = [t if t.requires_grad else t.detach().requires_grad_() for t in (x, weight, bias)]
            y = F.group_norm(inputs[0], ctx.groups, inputs[1], inputs[2], ctx.eps)
            y = F.silu(y) if ctx.silu else y
            return (*torch.autograd.grad(y, inputs, dy, create_graph=True), None, None, None)
        dx, dw, db = torch.ops.denoiser.group_norm_nhwc_backward(dy, x, weight, bias, mean, rstd, ctx.groups, ctx.silu)
        return dx, dw, db, None, None, None


def applies(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None) -> bool:
    """Whether the kernel takes GroupNorm(x) with these parameters: channels-last fp32/bf16 CPU x, fp32
    weight and bias, no transforms or compilation, the kernels built."""
    return (
        not tracing()  # first: tracing sees none of the checks below
        and weight is not None
        and bias is not None
        and plain_tensors(x, weight, bias)  # first: vmap'd tensors cannot even be asked is_contiguous
        and x.device.type == "cpu"
        and x.dim() == 4
        and x.dtype in (torch.float32, torch.bfloat16)
        and weight.dtype == torch.float32
        and bias.dtype == torch.float32
        and weight.is_contiguous()
        and bias.is_contiguous()
        and x.is_contiguous(memory_format=torch.channels_last)
        and not x.is_contiguous()  # truly NHWC; NCHW tensors are torch's fast case
        and load_kernels()
    )


def group_norm_nhwc(
    x: torch.Tensor, num_groups: int, weight: torch.Tensor, bias: torch.Tensor, eps: float, silu: bool
) -> torch.Tensor:
    """The kernel's GroupNorm(x) (+ SiLU); differentiable. Raises if the kernels are not built."""
    if not load_kernels():
        raise RuntimeError(f"fast GroupNorm kernel unavailable: {kernel_error()}")
    if not (torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad or bias.requires_grad)):
        # inference: the op alone (an autograd.Function costs ~30 us a call, 10% of a sampling step)
        return torch.ops.denoiser.group_norm_nhwc_forward(x, weight, bias, num_groups, eps, silu)[0]
    return _GroupNormNHWC.apply(x, weight, bias, num_groups, eps, silu)

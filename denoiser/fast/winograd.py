"""3x3 convolutions by Winograd's F(4x4, 3x3) during CPU inference (`csrc/winograd_conv.cpp`): `use_winograd(module)`.

Lavin & Gray, "Fast Algorithms for Convolutional Neural Networks" (2016): a 4x4 block of a 3x3 convolution's
outputs takes 36 multiplications per channel pair instead of 144. The filter is transformed once, U = G g Gᵀ (6x6
per input-output channel pair, `transform_weight`); each 6x6 input patch d becomes Bᵀ d B; their elementwise
product, summed over input channels, is 36 matrix products (tiles, C) x (C, K); Aᵀ m A turns each 6x6 result back
into 4x4 outputs. The kernel does the two data transforms and calls torch's bmm for the products, a block of tiles
at a time. On the shipped UNets it makes a float32 CPU call 1.2-1.4x faster at batch 8-32 (bench/fast_path_ab.py,
docs/speed.md), with predicted noise within about 4e-6 of direct convolution's.

Same function as `nn.Conv2d`, rounding differs: the transforms' constants make its float32 error about 8x direct
convolution's, still 1e-5 of the output's scale (tests/fast/test_winograd.py against float64). Only inference takes
it: float32 channels-last CPU inputs, no autograd, no autocast (bf16 runs torch's convolution), not while tracing.

`use_winograd(module)` swaps the class of each eligible `nn.Conv2d` (3x3, stride 1, padding 1, no groups or
dilation, at least `MIN_CHANNELS` in and out: the RGB convolutions at either end measured slower), in place, for
`Conv2d` below, the way `torch.nn.utils.parametrize` swaps a module's class: the same parameters, state-dict keys
and hooks, and `nn.Conv2d.forward` itself for anything the kernel does not cover. Every sampling door calls it
(`denoiser.sampling.loop.sampling_context`). The transformed weight is kept with the version of the weight it was
made from (36/9 = 4x the weight's memory), so a weight changed in place (an optimizer step, an EMA copy,
`load_state_dict`) is transformed again on its next call; a weight made under `torch.inference_mode` keeps no
version, so only a new tensor there is noticed.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
from collections.abc import Iterator

import torch
from torch import nn

from denoiser.fast.kernels import load_kernels, plain_tensors, tracing

__all__ = [
    "Conv2d", "use_winograd", "winograd_kernel", "switched", "transform_weight", "eligible", "MIN_CHANNELS",
    "WINOGRAD_ENV", "bf16_products",
]

WINOGRAD_ENV = "DENOISER_WINOGRAD"  # 0: direct convolution (torch's) even where the kernel is built
MIN_CHANNELS = 16
# inside `bf16_products(True)` (this thread, this call) the 36 products run in bfloat16: the per-op mix (mixed.py)
_BF16: contextvars.ContextVar[bool] = contextvars.ContextVar("winograd_bf16_products", default=False)

# G of F(4x4, 3x3) with interpolation points 0, ±1, ±2 and ∞ (the kernel's Bᵀ and Aᵀ use the same points).
_G = (
    (1 / 4, 0, 0),
    (-1 / 6, -1 / 6, -1 / 6),
    (-1 / 6, 1 / 6, -1 / 6),
    (1 / 24, 1 / 12, 1 / 6),
    (1 / 24, -1 / 12, 1 / 6),
    (0, 0, 1),
)


def winograd_kernel() -> bool:
    """Whether the Winograd kernel runs here: the kernels are built and DENOISER_WINOGRAD is not 0."""
    return os.environ.get(WINOGRAD_ENV, "1") != "0" and load_kernels()


@contextlib.contextmanager
def switched(on: bool) -> Iterator[None]:
    """Inside, the kernel runs (where built) or torch's convolution runs, for the whole process: benchmarks' A/B."""
    before = os.environ.get(WINOGRAD_ENV)
    os.environ[WINOGRAD_ENV] = "1" if on else "0"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(WINOGRAD_ENV, None)
        else:
            os.environ[WINOGRAD_ENV] = before


@torch.no_grad()
def transform_weight(weight: torch.Tensor) -> torch.Tensor:
    """(K, C, 3, 3) -> U (36, C, K) float32: G g Gᵀ per channel pair, computed in float64."""
    G = torch.tensor(_G, dtype=torch.float64)  # (6, 3)
    u = torch.einsum("ai,kcij,bj->abck", G, weight.detach().double().cpu(), G)  # (6, 6, C, K)
    return u.reshape(36, weight.shape[1], weight.shape[0]).float().contiguous()  # (36, C, K)


@contextlib.contextmanager
def bf16_products(on: bool = True) -> Iterator[None]:
    """Inside, the kernel's 36 products run as a bfloat16 bmm (the weight transformed once more, to bf16; V and M in
    bf16), the transforms, bias and output in float32 (`denoiser.fast.mixed`); `bf16_products(False)`: float32."""
    token = _BF16.set(on)
    try:
        yield
    finally:
        _BF16.reset(token)


def eligible(conv: nn.Module) -> bool:
    """A plain 3x3, stride 1, padding 1 convolution with at least MIN_CHANNELS in and out."""
    return (
        isinstance(conv, nn.Conv2d)
        and conv.kernel_size == (3, 3)
        and conv.stride == (1, 1)
        and conv.padding == (1, 1)
        and conv.dilation == (1, 1)
        and conv.groups == 1
        and conv.padding_mode == "zeros"
        and min(conv.in_channels, conv.out_channels) >= MIN_CHANNELS
    )


class Conv2d(nn.Conv2d):
    """nn.Conv2d whose float32 channels-last CPU inference runs Winograd's F(4x4, 3x3) (see the module docstring)."""

    # a class default: a module swapped in from nn.Conv2d never runs __init__
    _transformed: tuple[tuple, dict[torch.dtype, torch.Tensor]] | None = None  # (what the weight was, U by dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self._applies(x):
            return super().forward(x)
        return torch.ops.denoiser.winograd_conv3x3(x, self._u(torch.bfloat16 if _BF16.get() else torch.float32), self.bias)

    def _u(self, dtype: torch.dtype) -> torch.Tensor:
        """U in `dtype` (float32, or bfloat16 for the mix's products), transformed once per version of the weight."""
        w = self.weight
        version = None if w.is_inference() else w._version  # inference tensors keep no version: their address only
        key = (w.data_ptr(), version, w.dtype, tuple(w.shape))
        kept = self._transformed
        if kept is None or kept[0] != key:  # two threads may both transform a new weight: the same result
            kept = self._transformed = (key, {torch.float32: transform_weight(w)})
        if dtype not in kept[1]:
            kept[1][dtype] = kept[1][torch.float32].to(dtype)
        return kept[1][dtype]

    def _applies(self, x: torch.Tensor) -> bool:
        return (
            not tracing()  # first: tracing sees none of the checks below
            and not torch.is_grad_enabled()
            and not torch.is_autocast_enabled("cpu")  # bf16 autocast (denoiser.fast.precision): torch's convolution
            and x.device.type == "cpu"
            and x.dtype == torch.float32
            and self.weight.dtype == torch.float32
            and x.dim() == 4
            and x.is_contiguous(memory_format=torch.channels_last)
            and plain_tensors(x)
            and winograd_kernel()
        )


def use_winograd(module: nn.Module) -> None:
    """Swap each eligible `nn.Conv2d` among `module`'s modules for `Conv2d`, in place and for good (a no-op for
    those already swapped; subclasses of nn.Conv2d keep their own forward). Outside CPU float32 inference the
    swapped modules run nn.Conv2d.forward."""
    for m in module.modules():
        if type(m) is nn.Conv2d and eligible(m):
            m.__class__ = Conv2d

"""bf16 autocast's weights converted once: CPU bf16 inference without a weight cast at every call.

Under `torch.autocast("cpu", torch.bfloat16)` (`denoiser.fast.precision`'s "bfloat16") every convolution and linear
layer casts its float32 weight to bf16 at every call (in inference mode autocast keeps no cast from one call to the
next), and oneDNN then reorders a convolution's plain bf16 weight into its blocked layout, again at every call: about
200 casts and 50 reorders a cifar10 UNet call. Here each module keeps its bf16 weight (a convolution's already in
oneDNN's blocked layout, packed by `torch.ops.mkldnn` as torch's own inductor packs weights when it freezes a model),
made once per version of the weight, as Winograd's U is. The arithmetic is autocast's, bit for bit
(tests/fast/test_packed.py): the same bf16 operands into the same oneDNN kernels.

`Conv2d` and `Linear` are the base classes of every module the sampling doors swap in (Winograd's, batch
invariance's and the mix's), so this one place covers every convolution and linear layer of the UNet; outside CPU
bf16 autocast inference they are `nn.Conv2d` and `nn.Linear`.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import nn

from denoiser.fast.kernels import plain_tensors, tracing

__all__ = ["Bf16Weight", "Conv2d", "Linear", "applies", "switched"]

_ON: contextvars.ContextVar[bool] = contextvars.ContextVar("denoiser_packed", default=True)


@contextlib.contextmanager
def switched(on: bool) -> Iterator[None]:
    """Inside (this thread), the kept weights are used (on) or autocast casts every call (off): benchmarks' A/B."""
    token = _ON.set(on)
    try:
        yield
    finally:
        _ON.reset(token)


def applies(x: torch.Tensor) -> bool:
    """CPU inference under bf16 autocast, outside tracing: where the kept bf16 weights stand in for autocast's casts."""
    return (
        _ON.get()
        and not tracing()
        and not torch.is_grad_enabled()
        and torch.is_autocast_enabled("cpu")
        and torch.get_autocast_dtype("cpu") == torch.bfloat16
        and x.device.type == "cpu"
        and x.dtype in (torch.float32, torch.bfloat16)
        and plain_tensors(x)
    )


class Bf16Weight:
    """A module's weight and bias in bfloat16, converted once per version of the weight (`_weight16`), and what is
    made from them (`_kept`: a convolution's packed weight)."""

    _bf16: tuple[tuple, dict] | None = None  # (what the weight was, what was made from it); a class default

    def _kept(self) -> dict:
        w = self.weight
        version = None if w.is_inference() else w._version  # inference tensors keep no version: their address only
        b = self.bias
        key = (w.data_ptr(), version, tuple(w.shape), None if b is None else (b.data_ptr(), None if b.is_inference() else b._version))
        if self._bf16 is None or self._bf16[0] != key:  # two threads may both convert a new weight: the same result
            self._bf16 = (key, {})
        return self._bf16[1]

    def _weight16(self) -> torch.Tensor:
        kept = self._kept()
        if "weight" not in kept:
            kept["weight"] = self.weight.detach().to(torch.bfloat16)
        return kept["weight"]

    def _bias16(self) -> torch.Tensor | None:
        if self.bias is None:
            return None
        kept = self._kept()
        if "bias" not in kept:
            kept["bias"] = self.bias.detach().to(torch.bfloat16)
        return kept["bias"]


class Linear(Bf16Weight, nn.Linear):
    """nn.Linear that, under CPU bf16 autocast inference, multiplies by its kept bf16 weight."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.weight.dtype != torch.float32 or not applies(x):
            return super().forward(x)
        return F.linear(x.to(torch.bfloat16), self._weight16(), self._bias16())  # autocast's own operands


class Conv2d(Bf16Weight, nn.Conv2d):
    """nn.Conv2d that, under CPU bf16 autocast inference of a channels-last input, convolves with its weight packed
    once into oneDNN's layout."""

    def _conv_forward(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        if not (
            weight is self.weight
            and weight.dtype == torch.float32
            and self.padding_mode == "zeros"
            and isinstance(self.padding, tuple)  # not "same"/"valid"
            and x.dim() == 4
            and x.is_contiguous(memory_format=torch.channels_last)
            and applies(x)
            and torch.backends.mkldnn.is_available()
        ):
            return super()._conv_forward(x, weight, bias)
        kept = self._kept()
        if "packed" not in kept:
            kept["packed"] = torch._C._nn.mkldnn_reorder_conv2d_weight(
                self._weight16().to_mkldnn(), list(self.padding), list(self.stride), list(self.dilation), self.groups,
                list(x.shape))
        x = x.to(torch.bfloat16)  # (B, C, H, W), channels-last kept
        return torch.ops.mkldnn._convolution_pointwise(x, kept["packed"], self._bias16(), list(self.padding),
                                                       list(self.stride), list(self.dilation), self.groups, "none", [], "")

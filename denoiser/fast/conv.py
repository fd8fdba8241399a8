"""`Conv2d`: `nn.Conv2d` whose weight can be prepared once for a CPU sampling loop.

oneDNN (torch's CPU convolution) computes on weights in its own blocked layout; for a plain weight it
reorders the weight on every call. A sampling loop calls the same convolutions with the same input
sizes hundreds of times, so `prepacked(modules)` reorders each weight once per input size and the
calls go to oneDNN's convolution on the packed weight directly (`mkldnn::_convolution_pointwise`, the
op torch.compile's CPU backend emits). `conv(x, add=a)` is `conv(x) + a`; on the packed path the add is
oneDNN's binary post-op, done on each output block while it is in cache instead of in a pass of its
own (the ResBlock's timestep embedding and residual). Same parameters and state-dict keys as `nn.Conv2d`; the
module's `forward` runs for everything else (training, autograd, NCHW, other dtypes and devices).
Outputs equal the plain convolution's to float rounding (tests/test_conv.py).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterable, Iterator

import torch
from torch import nn

from denoiser.fast.kernels import tracing

__all__ = ["Conv2d", "prepacked", "can_prepack"]

_USERS = threading.Lock()  # guards the user counts below (prepacked may be open in several threads)


def can_prepack() -> bool:
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_convolution_weight")


class Conv2d(nn.Conv2d):
    """nn.Conv2d; inside `prepacked(...)`, inference on channels-last fp32 CPU inputs uses a weight
    reordered once per input size."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._packed: dict[tuple[int, ...], torch.Tensor] | None = None  # input shape -> oneDNN weight
        self._users = 0

    def forward(self, x: torch.Tensor, add: torch.Tensor | None = None) -> torch.Tensor:
        """conv(x), plus `add` (same shape, or (B, C_out, 1, 1) broadcast over pixels) when given."""
        if self._packed is None or not self._packed_applies(x, add):
            y = super().forward(x)
            return y if add is None else y + add
        key = tuple(x.shape)
        weight = self._packed.get(key)
        if weight is None:  # two threads may both pack a new size: the same result, stored twice
            weight = self._packed[key] = torch.ops.mkldnn._reorder_convolution_weight(
                self.weight.detach().contiguous(), list(self.padding), list(self.stride), list(self.dilation),
                self.groups, list(x.shape),
            )  # fmt: skip
        args = (weight, self.bias, list(self.padding), list(self.stride), list(self.dilation), self.groups)
        if add is None:
            return torch.ops.mkldnn._convolution_pointwise(x, *args, "none", [], None)
        # the add as oneDNN's binary post-op, applied to each output block while it is still in cache
        return torch.ops.mkldnn._convolution_pointwise.binary(x, add, *args, "add", None, None, [], None)

    def _output_shape(self, x: torch.Tensor) -> tuple[int, ...]:
        spatial = [
            (n + 2 * p - d * (k - 1) - 1) // s + 1
            for n, p, d, k, s in zip(x.shape[2:], self.padding, self.dilation, self.kernel_size, self.stride)
        ]
        return (x.shape[0], self.out_channels, *spatial)

    def _packed_applies(self, x: torch.Tensor, add: torch.Tensor | None) -> bool:
        return (
            not tracing()
            and x.device.type == "cpu"
            and x.dtype == torch.float32
            and self.weight.dtype == torch.float32
            and self.padding_mode == "zeros"
            and isinstance(self.padding, tuple)  # not "same"/"valid" strings
            and x.dim() == 4
            and x.is_contiguous(memory_format=torch.channels_last)
            and not torch.is_grad_enabled()
            and (add is None or _post_op_operand(add, self._output_shape(x)))
        )


def _post_op_operand(add: torch.Tensor, out_shape: tuple[int, ...]) -> bool:
    """Whether oneDNN's binary post-op takes `add` as it is: fp32 CPU, and either the output's shape
    channels-last or (B, C_out, 1, 1) broadcast over the pixels."""
    if add.device.type != "cpu" or add.dtype != torch.float32:
        return False
    if tuple(add.shape) == (*out_shape[:2], 1, 1):
        return add.is_contiguous()
    return tuple(add.shape) == out_shape and add.is_contiguous(memory_format=torch.channels_last)


@contextlib.contextmanager
def prepacked(modules: Iterable[nn.Module]) -> Iterator[None]:
    """While open, the `Conv2d`s among `modules` use weights packed for oneDNN (on first use per input
    size). The weights must not change meanwhile. Nests and may be open in several threads at once
    (the app re-runs a step for its attention view while another session samples): the packs are
    dropped when the last user leaves. A no-op where oneDNN is unavailable."""
    convs = [m for m in modules if isinstance(m, Conv2d)]
    if not can_prepack():
        yield
        return
    with _USERS:
        for m in convs:
            if m._users == 0:
                m._packed = {}
            m._users += 1
    try:
        yield
    finally:
        with _USERS:
            for m in convs:
                m._users -= 1
                if m._users == 0:
                    m._packed = None

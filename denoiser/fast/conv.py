"""Convolution weights packed once for oneDNN during a CPU sampling loop: `prepacked(modules)`.

oneDNN (torch's CPU convolution) computes on weights in its own blocked layout; for a plain weight it
reorders the weight on every call. A sampling loop calls the same convolutions with the same input sizes
hundreds of times, so inside `prepacked(modules)` each `nn.Conv2d` among the modules reorders its weight once
per input size and calls oneDNN's convolution on the packed weight directly (`mkldnn::_convolution_pointwise`,
the op torch.compile's CPU backend emits). Outputs equal the plain convolution's to float rounding
(tests/test_conv.py).

The model is written with torch's `nn.Conv2d`; the first `prepacked` swaps each one's class, in place, for
`Conv2d` below (the way `torch.nn.utils.parametrize` swaps a module's class): the same parameters, state-dict
keys, hooks and identity, and outside `prepacked`, or for anything it does not cover (training, autograd,
NCHW, other dtypes and devices, compilation), `nn.Conv2d.forward` itself.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterable, Iterator

import torch
from torch import nn

from denoiser.fast.kernels import tracing

__all__ = ["Conv2d", "prepacked", "can_prepack"]

_USERS = threading.Lock()  # guards the swaps and user counts below (prepacked may be open in several threads)


def can_prepack() -> bool:
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_convolution_weight")


class Conv2d(nn.Conv2d):
    """nn.Conv2d; inside `prepacked(...)`, inference on channels-last fp32 CPU inputs uses a weight
    reordered once per input size."""

    # class defaults: a module swapped in from nn.Conv2d never runs __init__
    _packed: dict[tuple[int, ...], torch.Tensor] | None = None  # input shape -> oneDNN weight, while packed
    _users = 0  # open `prepacked` blocks that include this module

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        packed = self._packed
        if packed is None or not self._packed_applies(x):
            return super().forward(x)
        key = tuple(x.shape)
        weight = packed.get(key)
        if weight is None:  # two threads may both pack a new size: the same result, stored twice
            weight = packed[key] = torch.ops.mkldnn._reorder_convolution_weight(
                self.weight.detach().contiguous(), list(self.padding), list(self.stride), list(self.dilation),
                self.groups, list(x.shape),
            )  # fmt: skip
        args = (weight, self.bias, list(self.padding), list(self.stride), list(self.dilation), self.groups)
        return torch.ops.mkldnn._convolution_pointwise(x, *args, "none", [], None)

    def _packed_applies(self, x: torch.Tensor) -> bool:
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
            and not torch.is_autocast_enabled("cpu")  # bf16 autocast (denoiser.fast.precision): torch's conv runs it
        )


@contextlib.contextmanager
def prepacked(modules: Iterable[nn.Module]) -> Iterator[None]:
    """While open, the convolutions among `modules` (`nn.Conv2d`s, swapped for `Conv2d` on first use, and
    `Conv2d`s) use weights packed for oneDNN (on first use per input size). The weights must not change
    meanwhile. Nests and may be open in several threads at once (the app re-runs a step for its attention
    view while another session samples): the packs are dropped when the last user leaves. Subclasses of
    nn.Conv2d other than `Conv2d` keep their own forward. A no-op where oneDNN is unavailable."""
    modules = list(modules)
    if not can_prepack():
        yield
        return
    with _USERS:
        convs = []
        for m in modules:
            if type(m) is nn.Conv2d:
                m.__class__ = Conv2d  # for good: outside prepacked its forward is nn.Conv2d's
            if isinstance(m, Conv2d):
                convs.append(m)
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

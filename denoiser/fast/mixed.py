"""The per-op bfloat16 mix: each op in the precision this CPU computes it fastest in, for CPU inference.

Whole-call bf16 autocast (`denoiser.fast.precision`'s "bfloat16") runs every convolution direct in oneDNN (it throws
Winograd's 4x fewer multiplications away). The mix
keeps what is fast in float32 and moves only the matrix products to bfloat16, where a CPU with avx512_bf16 or AMX
runs them 2.4-2.9x faster (bench/precision_mix.md):

- Winograd's 36 products (`denoiser.fast.winograd.bf16_products`): V, U and M in bf16, the transforms in float32;
- the linear layers over tokens (attention's projections) and the 1x1 convolutions (the ResBlocks' skips): the
  activation rounded to bf16 on the way in, the product back in float32, the weight converted once (kept with the
  version of the weight it was made from, as Winograd's U is);
- everything else float32: GroupNorm, attention's softmax, the timestep path (its linear layers see (B, D) rows, not
  tokens), the RGB convolutions at either end, and the scheduler.

`use_mixed(module)` swaps the class of each eligible `nn.Linear` and 1x1 `nn.Conv2d` in place (as `use_winograd`
does): the same parameters and state dict, and torch's forward outside `on()` or outside CPU float32 inference.
`denoiser.fast.precision` enters `on()` where the plan's precision is "mixed"; `full_precision()` (attention capture)
switches it off, so the maps the app shows stay the float32 model's exact weights.

`Linear` builds on `denoiser.fast.batch_invariant.Linear`: its (B, D) rows (the timestep path) stay float32, one row at a time.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import nn

from denoiser.fast import batch_invariant, winograd

__all__ = ["Linear", "Conv1x1", "use_mixed", "on", "off", "active"]

_ON: contextvars.ContextVar[bool] = contextvars.ContextVar("denoiser_mixed", default=False)


def active() -> bool:
    """Whether this thread's call runs the mix."""
    return _ON.get()


@contextlib.contextmanager
def _set(value: bool) -> Iterator[None]:
    token = _ON.set(value)
    try:
        with winograd.bf16_products(value):
            yield
    finally:
        _ON.reset(token)


def on() -> contextlib.AbstractContextManager[None]:
    """Inside (this thread, this call), the swapped modules and Winograd's products run in bfloat16."""
    return _set(True)


def off() -> contextlib.AbstractContextManager[None]:
    """Inside, everything float32 again (an attention capture inside a mixed run)."""
    return _set(False)


class _Bf16Weight:
    """The module's weight in bfloat16, converted once per version of the weight."""

    _bf16: tuple[tuple, torch.Tensor] | None = None  # (what the weight was, its bf16 copy); a class default

    def _weight16(self) -> torch.Tensor:
        w = self.weight
        version = None if w.is_inference() else w._version  # inference tensors keep no version: their address only
        key = (w.data_ptr(), version, tuple(w.shape))
        if self._bf16 is None or self._bf16[0] != key:
            self._bf16 = (key, w.detach().to(torch.bfloat16))
        return self._bf16[1]

    def _runs_bf16(self, x: torch.Tensor) -> bool:
        return _ON.get() and batch_invariant.inference(x, self.weight)


class Linear(_Bf16Weight, batch_invariant.Linear):
    """nn.Linear whose product over tokens (B, N, C) runs in bfloat16 inside `on()`; its (B, D) rows (the timestep
    path) as `batch_invariant.Linear`'s, float32 row by row."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() < 3 or not self._runs_bf16(x):
            return super().forward(x)
        bias = None if self.bias is None else self.bias.to(torch.bfloat16)
        return F.linear(x.to(torch.bfloat16), self._weight16(), bias).float()


class Conv1x1(_Bf16Weight, nn.Conv2d):
    """A 1x1 nn.Conv2d whose channels-last product runs in bfloat16 inside `on()`: a linear layer over each pixel."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not (x.dim() == 4 and x.is_contiguous(memory_format=torch.channels_last) and self._runs_bf16(x)):
            return super().forward(x)
        w = self._weight16()[:, :, 0, 0]  # (K, C)
        bias = None if self.bias is None else self.bias.to(torch.bfloat16)
        y = F.linear(x.permute(0, 2, 3, 1).to(torch.bfloat16), w, bias)  # (B, H, W, C) -> (B, H, W, K)
        return y.float().permute(0, 3, 1, 2)  # (B, K, H, W), channels-last in memory


def use_mixed(module: nn.Module) -> None:
    """Swap each `nn.Linear` (or `batch_invariant.Linear`) and plain 1x1 `nn.Conv2d` among `module`'s modules for `Linear` /
    `Conv1x1`, in place and for good (a no-op for those already swapped)."""
    for m in module.modules():
        if type(m) in (nn.Linear, batch_invariant.Linear):
            m.__class__ = Linear
        elif batch_invariant.pointwise(m):
            m.__class__ = Conv1x1

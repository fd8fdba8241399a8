"""The per-op bfloat16 mix: each op in the precision this CPU computes it fastest in, for CPU inference.

Whole-call bf16 autocast (`denoiser.fast.precision`'s "bfloat16") runs every convolution direct in oneDNN (it throws
Winograd's 4x fewer multiplications away) and attention by torch's flash kernel, slower than the float32 one. The mix
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

The swapped linear layers do one thing in every precision during CPU inference (every sampling door swaps them,
`denoiser.sampling.loop.sampling_context`): the timestep path's (B, D) rows are multiplied one row at a time
(`rows`), in float32. MKL's GEMM rounds a row differently with the number of rows (its small-M paths), so an image's
timestep embedding, and with it its pixels, moved with the batch size; row by row it cannot. For the same reason the
convolutions no other path takes (the RGB ones at either end) run one image at a time (`PerImageConv2d`): oneDNN
picks another algorithm for a batch of one.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import nn

from denoiser.fast import winograd
from denoiser.fast.kernels import plain_tensors, tracing

__all__ = ["Linear", "Conv1x1", "PerImageConv2d", "use_mixed", "on", "off", "active", "rows"]

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
        return _ON.get() and self._inference(x)

    def _inference(self, x: torch.Tensor) -> bool:
        """CPU float32 inference, outside autocast and tracing: where the swapped forward applies."""
        return (
            not tracing()
            and not torch.is_grad_enabled()
            and not torch.is_autocast_enabled("cpu")
            and x.device.type == "cpu"
            and x.dtype == torch.float32
            and self.weight.dtype == torch.float32
            and plain_tensors(x)
        )


def rows(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """F.linear of (B, D) rows, one row's product at a time (a batch of 1xD products): a row's result never depends
    on how many rows there are."""
    B, (K, D) = x.shape[0], weight.shape
    w = weight.t().expand(B, D, K)  # (B, D, K), no copy
    if bias is None:
        return torch.bmm(x[:, None, :], w)[:, 0]  # (B, 1, D) x (B, D, K) -> (B, K)
    return torch.baddbmm(bias.expand(B, 1, K), x[:, None, :], w)[:, 0]


class Linear(_Bf16Weight, nn.Linear):
    """nn.Linear whose product over tokens (B, N, C) runs in bfloat16 inside `on()`, and whose (B, D) rows (the
    timestep path) are multiplied row by row in float32 (`rows`) in any CPU inference."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() == 2 and self._inference(x):
            return rows(x, self.weight, self.bias)
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


class PerImageConv2d(_Bf16Weight, nn.Conv2d):
    """nn.Conv2d that runs one image at a time in CPU float32 inference: an image's pixels never depend on the batch."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 4 or x.shape[0] == 1 or not self._inference(x):
            return super().forward(x)
        return torch.cat([super(PerImageConv2d, self).forward(x[i : i + 1]) for i in range(x.shape[0])])


def _conv1x1(m: nn.Module) -> bool:
    return (type(m) is nn.Conv2d and m.kernel_size == (1, 1) and m.stride == (1, 1) and m.padding == (0, 0)
            and m.dilation == (1, 1) and m.groups == 1)


def use_mixed(module: nn.Module) -> None:
    """Swap each `nn.Linear`, 1x1 `nn.Conv2d` and other convolution Winograd's algorithm does not take among `module`'s
    modules for `Linear` / `Conv1x1` / `PerImageConv2d`, in place and for good (a no-op for those already swapped)."""
    for m in module.modules():
        if type(m) is nn.Linear:
            m.__class__ = Linear
        elif _conv1x1(m):
            m.__class__ = Conv1x1
        elif type(m) is nn.Conv2d and not winograd.eligible(m):  # what Winograd's swap left: the RGB convolutions
            m.__class__ = PerImageConv2d

"""Batch invariance: an image's pixels never depend on how many images share its batch, in CPU float32 inference.

Two ops computed an image's numbers differently with the batch size, so the same seed drew another picture at
another `--num-images` (docs/reproducibility.md):

- the timestep path's linear layers see (B, D) rows, and MKL's GEMM rounds a row differently with the number of rows
  (its small-M paths): `rows` multiplies them one row at a time (a batch of 1xD products);
- the convolutions no faster path takes (the RGB ones at either end of the UNet): oneDNN picks another algorithm for
  a batch of one, so `PerImageConv2d` runs them one image at a time.

`use_batch_invariant(module)` swaps the class of each `nn.Linear` and each convolution Winograd's algorithm does not take, in
place (as `use_winograd` does): the same parameters and state dict, and torch's forward outside CPU float32
inference. Every sampling door swaps them (`denoiser.sampling.loop.sampling_context`); the bf16 mix
(`denoiser.fast.mixed`) builds on `Linear`.
"""

from __future__ import annotations

import torch
from torch import nn

from denoiser.fast import winograd
from denoiser.fast.kernels import plain_tensors, tracing

__all__ = ["rows", "inference", "pointwise", "Linear", "PerImageConv2d", "use_batch_invariant"]


def inference(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """CPU float32 inference, outside autocast and tracing: where the swapped forwards apply."""
    return (
        not tracing()
        and not torch.is_grad_enabled()
        and not torch.is_autocast_enabled("cpu")
        and x.device.type == "cpu"
        and x.dtype == torch.float32
        and weight.dtype == torch.float32
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


class Linear(nn.Linear):
    """nn.Linear whose (B, D) rows (the timestep path) are multiplied row by row (`rows`) in CPU float32 inference."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() == 2 and inference(x, self.weight):
            return rows(x, self.weight, self.bias)
        return super().forward(x)


class PerImageConv2d(nn.Conv2d):
    """nn.Conv2d that runs one image at a time in CPU float32 inference: an image's pixels never depend on the batch."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 4 or x.shape[0] == 1 or not inference(x, self.weight):
            return super().forward(x)
        return torch.cat([super(PerImageConv2d, self).forward(x[i : i + 1]) for i in range(x.shape[0])])


def pointwise(m: nn.Module) -> bool:
    """A plain 1x1 convolution (a linear layer over each pixel: the bf16 mix's `Conv1x1` takes it)."""
    return (type(m) is nn.Conv2d and m.kernel_size == (1, 1) and m.stride == (1, 1) and m.padding == (0, 0)
            and m.dilation == (1, 1) and m.groups == 1)


def use_batch_invariant(module: nn.Module) -> None:
    """Swap each `nn.Linear` for `Linear` and each convolution Winograd's algorithm does not take (nor the mix's 1x1
    swap) for `PerImageConv2d`, in place and for good (a no-op for those already swapped)."""
    for m in module.modules():
        if type(m) is nn.Linear:
            m.__class__ = Linear
        elif type(m) is nn.Conv2d and not winograd.eligible(m) and not pointwise(m):
            m.__class__ = PerImageConv2d

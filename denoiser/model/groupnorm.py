"""GroupNorm (Wu & He 2018) with the SiLU that follows it in the U-Net.

`GroupNorm` is `nn.GroupNorm` (same parameters, same state-dict keys) with an optional fused SiLU. Its
math is `torch.nn.functional.group_norm` followed by `F.silu`; for channels-last CPU tensors the speed
layer's kernel computes the same function (`denoiser.fast.groupnorm`, built at install; without it,
or with DENOISER_KERNELS=0, the reference runs and only speed changes).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from denoiser.fast import groupnorm as fast_groupnorm

__all__ = ["GroupNorm", "group_norm"]


def group_norm(
    x: torch.Tensor,
    num_groups: int,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    eps: float,
    silu: bool = False,
    fast: bool | None = None,
) -> torch.Tensor:
    """GroupNorm of (B, C, H, W) x, then SiLU if `silu`. fast: None picks the kernel where it applies,
    False forces the reference (F.group_norm, F.silu), True requires the kernel."""
    if fast_groupnorm.applies(x, weight, bias) if fast is None else fast:
        return fast_groupnorm.group_norm_nhwc(x, num_groups, weight, bias, eps, silu)
    y = F.group_norm(x, num_groups, weight, bias, eps)
    return F.silu(y) if silu else y


class GroupNorm(nn.GroupNorm):
    """`nn.GroupNorm` with an optional fused SiLU; `fast` as in `group_norm` (None: automatic)."""

    def __init__(self, num_groups: int, num_channels: int, eps: float = 1e-6, silu: bool = False):
        super().__init__(num_groups, num_channels, eps=eps)
        self.silu = silu
        self.fast: bool | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return group_norm(x, self.num_groups, self.weight, self.bias, self.eps, self.silu, self.fast)

    def extra_repr(self) -> str:
        return super().extra_repr() + (", silu=True" if self.silu else "")

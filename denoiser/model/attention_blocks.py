"""The U-Net's attention blocks, and the switches that change what chosen blocks compute.

In the U-Net a (B, C, H, W) feature map becomes N = H·W pixel tokens of C values (Ho et al. 2020, the self-attention
block of PixelCNN++/DDPM): `SpatialSelfAttention` is GroupNorm, multi-head self-attention over those tokens and a
residual add; `SpatialCrossAttention` (Rombach et al. 2022) the same with keys and values from a prompt's tokens.
The attention inside each block is `denoiser.model.attention`'s four stages.

`edit_attention(model, self_edit, cross_edit)` changes the weights after the softmax by one rule
(`denoiser.model.attention_edit.AttentionEdit`: a factor per key, and weights taken from another batch row): prompt
weighting and prompt-to-prompt editing (`denoiser.sampling.prompt_to_prompt`). Captures record it, so the maps are the weights
that ran.

`identity_attention(model, layers)` is the one switch that turns chosen self-attention layers' (or heads') weights
into the identity matrix: each pixel attends only to itself, so stages (2)-(4) return v. Perturbed-attention
guidance (Ahn et al. 2024) and the attention ablations (denoiser.evaluate.attention_stats) use it; `batch_start` perturbs only
the batch rows from there on, so a guided step runs both passes in one batch.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator

import torch
from torch import nn

from denoiser.model.attention import EDITS, IDENTITY, MultiHeadCrossAttention, MultiHeadSelfAttention, attention_layers
from denoiser.model.attention_edit import AttentionEdit
from denoiser.model.groupnorm import GroupNorm

__all__ = [
    "SpatialSelfAttention",
    "SpatialCrossAttention",
    "to_tokens",
    "from_tokens",
    "edit_attention",
    "identity_attention",
]


# --------------------------------------------------------------------------------------------
# Tokens <-> feature maps: the one place that flattens pixels into a sequence
# --------------------------------------------------------------------------------------------


def to_tokens(x: torch.Tensor) -> torch.Tensor:
    """(B, C, H, W) feature map -> (B, N, C) pixel tokens, N = H·W in row-major order."""
    B, C, H, W = x.shape
    return x.reshape(B, C, H * W).transpose(1, 2)  # (B, N, C)


def from_tokens(x: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """(B, N, C) pixel tokens -> (B, C, H, W) feature map."""
    B, N, C = x.shape
    if N != height * width:
        raise ValueError(f"{N} tokens cannot form a {height}x{width} map")
    return x.transpose(1, 2).reshape(B, C, height, width)  # (B, C, H, W)


# --------------------------------------------------------------------------------------------
# The blocks: GroupNorm, pixel tokens, attention, residual add
# --------------------------------------------------------------------------------------------


def _block_norm(channels: int, norm_num_groups: int) -> GroupNorm:
    """The GroupNorm in front of a spatial attention block (self or cross), its groups checked against the channels."""
    if channels % norm_num_groups:
        raise ValueError(f"norm_num_groups={norm_num_groups} must divide the channels ({channels})")
    return GroupNorm(norm_num_groups, channels, eps=1e-6)


class SpatialSelfAttention(nn.Module):
    """Pixel attention block: GroupNorm -> H·W tokens -> multi-head attention -> back -> residual add.

    Single-head with head dim = C by default, as in DDPM; `num_heads` or `head_dim` for more heads.
    """

    def __init__(
        self,
        channels: int,
        num_heads: int | None = None,
        head_dim: int | None = None,
        norm_num_groups: int = 32,
        fused_attn: bool | None = None,
    ) -> None:
        super().__init__()
        self.norm = _block_norm(channels, norm_num_groups)
        self.attention = MultiHeadSelfAttention(channels, num_heads, head_dim, fused_attn=fused_attn)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, C, H, W = x.shape
        tokens = to_tokens(self.norm(x))  # (B, N, C)
        out = self.attention(tokens, spatial_size=(H, W))  # (B, N, C)
        return x + from_tokens(out, H, W)  # (B, C, H, W)


class SpatialCrossAttention(nn.Module):
    """Pixel-to-prompt block: GroupNorm -> H·W tokens -> cross-attention to `context` -> back -> residual add.

    The heads split the channels as in `SpatialSelfAttention`. The output projection starts at zero, so a new
    block adds nothing until trained: a model gaining cross-attention starts as the model it was.
    """

    def __init__(
        self,
        channels: int,
        context_dim: int,
        num_heads: int | None = None,
        head_dim: int | None = None,
        norm_num_groups: int = 32,
        fused_attn: bool | None = None,
    ) -> None:
        super().__init__()
        self.norm = _block_norm(channels, norm_num_groups)
        self.attention = MultiHeadCrossAttention(channels, context_dim, num_heads, head_dim, fused_attn=fused_attn)
        nn.init.zeros_(self.attention.proj.weight)
        nn.init.zeros_(self.attention.proj.bias)

    def forward(self, x: torch.Tensor, context: torch.Tensor, key_mask: torch.Tensor | None = None) -> torch.Tensor:
        """x (B, C, H, W), context (B, L, context_dim), key_mask (B, L) bool (True = attend) -> (B, C, H, W)."""
        B, C, H, W = x.shape
        tokens = to_tokens(self.norm(x))  # (B, N, C)
        out = self.attention(tokens, context, key_mask, spatial_size=(H, W))  # (B, N, C)
        return x + from_tokens(out, H, W)  # (B, C, H, W)


# --------------------------------------------------------------------------------------------
# Switches on chosen blocks: edited weights, and identity weights (the output of stages (2)-(4) is v)
# --------------------------------------------------------------------------------------------


@contextlib.contextmanager
def edit_attention(
    module: nn.Module, self_edit: AttentionEdit | None = None, cross_edit: AttentionEdit | None = None
) -> Iterator[None]:
    """Within, every self-attention layer of `module` runs with `self_edit` and every cross-attention layer with
    `cross_edit` (None: unedited), each call's batch rows as the edit's. A context variable, as captures."""
    edits = {m: self_edit if m.kind == "self" else cross_edit for m in attention_layers(module).values()}
    with EDITS.set({m: e for m, e in edits.items() if e is not None}):
        yield


@contextlib.contextmanager
def identity_attention(
    module: nn.Module,
    layers: Iterable[str] | None = None,
    heads: Iterable[int] | None = None,
    batch_start: int = 0,
) -> Iterator[None]:
    """Within, the chosen self-attention layers of `module` use identity weights (each pixel attends to itself).

    layers: names from `attention_layer_names` (None: every self-attention layer); heads: head indices switched in
    each chosen layer (None: all); batch_start: only batch rows from this index on are perturbed. Like
    captures, the switch lives in a context variable: other threads using the same model are untouched.
    """
    by_name = attention_layers(module, "self")
    if not by_name:
        raise ValueError(f"{type(module).__name__} contains no attention layers to switch")
    names = list(by_name) if layers is None else list(layers)
    unknown = [n for n in names if n not in by_name]
    cross = [n for n in unknown if n in attention_layers(module, "cross")]
    if cross:
        raise ValueError(f"{', '.join(map(repr, cross))}: identity weights need queries and keys of the same pixels; "
                         f"choose self-attention layers: {', '.join(by_name)}")
    if unknown:
        raise ValueError(f"unknown attention layer(s) {', '.join(map(repr, unknown))}; this model has: {', '.join(by_name)}")
    head_ids = None if heads is None else tuple(sorted({int(h) for h in heads}))
    for name in names:
        n_heads = by_name[name].num_heads
        if head_ids is not None and (not head_ids or head_ids[0] < 0 or head_ids[-1] >= n_heads):
            raise ValueError(f"heads must lie in 0..{n_heads - 1} for layer {name!r}, got {list(heads)}")
    if batch_start < 0:
        raise ValueError(f"batch_start must be >= 0, got {batch_start}")
    active = IDENTITY.active()
    # a layer already switched off for every row and head (an ablation) stays off inside a narrower switch (PAG)
    chosen = {by_name[n]: (head_ids, batch_start) for n in names if active.get(by_name[n]) != (None, 0)}
    with IDENTITY.set(chosen):
        yield

"""Scaled dot-product attention, written as its four stages, and the pixel-attention block.

Vaswani et al. 2017, "Attention Is All You Need", eq. (1):

    (1) project tokens X to queries Q, keys K, values V with learned layers
    (2) scores  = Q Kᵀ / √d_k
    (3) weights = softmax(scores) over the keys, so each query's weights sum to one
    (4) output  = weights V

`scaled_dot_product_attention` is the readable reference for stages (2)-(4). The modules below use
torch's fused kernel on the fast path (`denoiser.fast` adds a CPU kernel for small heads) and this reference on the readable one; a switch per module
(`fused_attn`, as in timm) picks the path and the tests assert both compute the same function.

In the U-Net a (B, C, H, W) feature map becomes N = H·W pixel tokens of C values (Ho et al. 2020,
the self-attention block of PixelCNN++/DDPM); heads split the C channels into h groups of d = C / h.

Cross-attention (Rombach et al. 2022, the conditioning of Latent/Stable Diffusion) is the same attention
with a different stage (1): queries from the pixel tokens, keys and values from a prompt's L tokens
(B, L, context_dim), projected to C channels. `MultiHeadAttention` holds what both share: the head split,
stages (2)-(4) on either path, capture and the output projection; `MultiHeadSelfAttention` and
`MultiHeadCrossAttention` are only their stage (1). Padding tokens (a key mask, True = attend) get weight
zero; a prompt of nothing but padding attends nowhere, so its cross-attention adds nothing (its "no prompt").

`capture_attention(model)` records q and k of every attention call (O(N·d) memory, never the N×N
matrix) without touching the computation, so any query pixel's exact weights can be rebuilt later, and
for a cross-attention layer any prompt token's map over the pixels (`AttentionRecord.token_map`).

`edit_attention(model, self_edit, cross_edit)` changes the weights after the softmax by one rule
(`denoiser.attention_edit.AttentionEdit`: a factor per key, and weights taken from another batch row): prompt
weighting and prompt-to-prompt editing (`denoiser.prompt_edit`). The readable path applies it to the explicit
weights, the fast path moves it onto the values and stays fused; captures record it, so the maps are the weights
that ran.

`identity_attention(model, layers)` is the one switch that turns chosen self-attention layers' (or heads')
weights into the identity matrix: each pixel attends only to itself, so stages (2)-(4) return v. Perturbed-attention
guidance (Ahn et al. 2024) and the attention ablations (denoiser.attention_stats) use it; `batch_start`
perturbs only the batch rows from there on, so a guided step runs both passes in one batch.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import torch
from torch import nn

from denoiser.attention_edit import AttentionEdit
from denoiser.fast.attention import sdpa as fast_sdpa
from denoiser.groupnorm import GroupNorm

__all__ = [
    "scaled_dot_product_attention",
    "attention_scores",
    "attention_weights",
    "AttentionHead",
    "MultiHeadAttention",
    "MultiHeadSelfAttention",
    "MultiHeadCrossAttention",
    "SpatialSelfAttention",
    "SpatialCrossAttention",
    "AttentionRecord",
    "capture_attention",
    "identity_attention",
    "edit_attention",
    "attention_layer_names",
    "to_tokens",
    "from_tokens",
]


# --------------------------------------------------------------------------------------------
# Stages (2)-(4): the explicit reference
# --------------------------------------------------------------------------------------------


def attention_scores(
    q: torch.Tensor,
    k: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    is_causal: bool = False,
    scale: float | None = None,
) -> torch.Tensor:
    """Stage (2): scores = q kᵀ · scale, with the mask applied. (..., L, d), (..., S, d) -> (..., L, S).

    A bool mask keeps True positions (False becomes -inf); a float mask is added after scaling;
    `is_causal` keeps the top-left lower triangle, as torch does for L != S.
    """
    if attn_mask is not None and is_causal:
        raise ValueError("pass either attn_mask or is_causal=True, not both (torch SDPA refuses both)")
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = (q @ k.transpose(-2, -1)) * scale  # (..., L, S)
    L, S = scores.shape[-2], scores.shape[-1]
    if is_causal:
        attn_mask = torch.ones(L, S, dtype=torch.bool, device=q.device).tril()
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            scores = scores.masked_fill(~attn_mask, float("-inf"))
        else:
            scores = scores + attn_mask.to(scores.dtype)
    return scores


def attention_weights(scores: torch.Tensor, masked: bool = True) -> torch.Tensor:
    """Stage (3): softmax over the keys (the last dim), so each query's weights sum to one.

    A query whose keys are all masked (every score -inf) would get NaN: it gets zero weights instead.
    masked=False says no score is -inf (no mask was applied), which skips that check.
    """
    weights = torch.softmax(scores, dim=-1)
    if masked:
        fully_masked = torch.isneginf(scores).all(dim=-1, keepdim=True)  # (..., L, 1)
        weights = weights.masked_fill(fully_masked, 0.0)
    return weights


def scaled_dot_product_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    is_causal: bool = False,
    scale: float | None = None,
    return_weights: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """The readable reference with the semantics of `torch.nn.functional.scaled_dot_product_attention`.

    q (..., L, d), k (..., S, d), v (..., S, d_v) -> output (..., L, d_v) [, weights (..., L, S)].
    Batch and head dimensions broadcast, and so do masks. A query whose keys are all masked gets
    zero weights and a zero output, never NaN. fp16/bf16 inputs are computed in fp32 (as the fused
    kernels accumulate) and cast back.
    """
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q and k must share the head dim, got {q.shape[-1]} and {k.shape[-1]}")
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(f"k and v must have the same number of keys, got {k.shape[-2]} and {v.shape[-2]}")
    out_dtype = q.dtype
    q, k, v = _at_least_fp32(q), _at_least_fp32(k), _at_least_fp32(v)
    # (2) scaled scores, masked
    scores = attention_scores(q, k, attn_mask, is_causal, scale)  # (..., L, S)
    # (3) softmax over keys; only a mask can hide every key of a row
    weights = attention_weights(scores, masked=attn_mask is not None or is_causal)
    # (4) weighted sum of the values
    out = weights @ v  # (..., L, d_v)
    if return_weights:
        return out.to(out_dtype), weights.to(out_dtype)
    return out.to(out_dtype)


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
# Stage (1) and the modules
# --------------------------------------------------------------------------------------------


class AttentionHead(nn.Module):
    """One attention head, the classic way: its own query, key and value layers.

    x (B, N, hidden_size) -> (attention_output (B, N, head_size), attention_probs (B, N, N)).
    """

    def __init__(self, hidden_size: int, attention_head_size: int, bias: bool = True) -> None:
        super().__init__()
        self.attention_head_size = attention_head_size
        self.query = nn.Linear(hidden_size, attention_head_size, bias=bias)
        self.key = nn.Linear(hidden_size, attention_head_size, bias=bias)
        self.value = nn.Linear(hidden_size, attention_head_size, bias=bias)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        q, k, v = self.query(x), self.key(x), self.value(x)  # (1) each (B, N, d)
        return scaled_dot_product_attention(q, k, v, return_weights=True)  # (2)-(4)


def fused_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: torch.Tensor | None = None
) -> torch.Tensor:
    """Stages (2)-(4) on the fast path, (B, h, L, d), (B, h, S, d) -> (B, h, L, d): torch's fused SDPA, or for CPU
    inference with small heads the speed layer's kernel (`denoiser.fast.attention`), the same function."""
    return fast_sdpa(q, k, v, attn_mask)


def _num_heads(dim: int, num_heads: int | None, head_dim: int | None) -> int:
    """The number of heads that split `dim` channels, from either count or head size (one head if neither)."""
    if num_heads is None and head_dim is None:
        num_heads = 1
    if num_heads is None:
        if head_dim <= 0 or dim % head_dim:
            raise ValueError(f"head_dim must divide the channels, got head_dim={head_dim}, channels={dim}")
        num_heads = dim // head_dim
    elif head_dim is not None and num_heads * head_dim != dim:
        raise ValueError(f"num_heads * head_dim must equal the channels: {num_heads} * {head_dim} != {dim}")
    if num_heads <= 0 or dim % num_heads:
        raise ValueError(f"num_heads must divide the channels, got num_heads={num_heads}, channels={dim}")
    return num_heads


class MultiHeadAttention(nn.Module):
    """What every attention layer shares after stage (1): h heads over the C channels, stages (2)-(4) on the
    fused or the readable path, capture, the identity switch, heads concatenated and the output projection.

    Head i uses channels [i·d, (i+1)·d) of each of q, k and v: exactly `num_heads` `AttentionHead`s
    whose outputs are concatenated, then projected. Subclasses are stage (1): where q, k and v come from; each
    builds its projections, then `proj` (the order of the random initialisation and of the state dict).

    fused_attn: True uses the fused path (`fused_attention`); False the readable reference. None (default) picks
    the faster correct path per device and dtype: the reference for CPU training in fp16/bf16,
    where torch's fused CPU backward is several times slower for short sequences, fused otherwise.
    """

    kind = "self"  # "self": queries and keys are the same tokens; "cross": keys are a prompt's tokens

    def __init__(self, dim: int, num_heads: int | None, head_dim: int | None, fused_attn: bool | None) -> None:
        super().__init__()
        self.dim = dim
        self.num_heads = _num_heads(dim, num_heads, head_dim)
        self.head_dim = dim // self.num_heads
        self.scale = self.head_dim**-0.5
        self.fused_attn = fused_attn

    @property
    def _recorder(self):
        """This call's recorder when `capture_attention` is open around it in the current thread/context."""
        active = _CAPTURES.get()
        return None if active is None else active.get(self)

    def _use_fused(self, q: torch.Tensor) -> bool:
        if self.fused_attn is not None:
            return self.fused_attn
        low_precision = q.dtype in (torch.float16, torch.bfloat16)
        return not (q.device.type == "cpu" and low_precision and torch.is_grad_enabled())

    def _attention(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        spatial_size: tuple[int, int] | None,
        key_mask: torch.Tensor | None = None,
        attend_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Stages (2)-(4) on every head, then the heads concatenated and projected.

        q (B, h, L, d), k and v (B, h, S, d) -> (B, L, C). key_mask (B, S) bool, True = attend: what a capture
        records; attend_mask (B, S): the mask the attention runs with (default: key_mask).
        """
        edits = _EDITS.get()
        edit = None if edits is None else edits.get(self)
        if self._recorder is not None:
            self._recorder(q, k, self.scale, spatial_size, key_mask, edit)
        switch = _IDENTITY.get()
        identity = None if switch is None else switch.get(self)
        mask = key_mask if attend_mask is None else attend_mask
        if edit is not None:
            if identity is not None:
                raise ValueError("an attention layer cannot be switched to identity weights and edited in one call: "
                                 "prompt-to-prompt editing runs without perturbed-attention guidance (set PAG to 0)")
            out = self._attend_edited(q, k, v, mask, edit)  # (B, h, L, d)
        elif identity is None:
            out = self._attend(q, k, v, mask)  # (B, h, L, d)
        else:
            out = _identity_rows(self._attend, q, k, v, *identity)  # (B, h, L, d)
        B, h, L, d = out.shape
        out = out.transpose(1, 2).reshape(B, L, h * d)  # (B, L, C): heads concatenated
        return self.proj(out)

    def _attend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """(2)-(4) on the fast or the readable path, (B, h, L, d), (B, h, S, d) -> (B, h, L, d)."""
        mask = None if key_mask is None else key_mask[:, None, None, :]  # (B, 1, 1, S): every head, every query
        if self._use_fused(q):
            return fused_attention(q, k, v, mask)
        return scaled_dot_product_attention(q, k, v, attn_mask=mask)

    def _attend_edited(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_mask: torch.Tensor | None, edit: AttentionEdit
    ) -> torch.Tensor:
        """(2)-(4) with the weights edited after (3): on the fast path the edit moves onto the values (still fused
        SDPA); on the readable path it is applied to the explicit weights. (B, h, L, d), (B, h, S, d) -> (B, h, L, d)."""
        if self._use_fused(q):
            return edit.fused(self._attend, q, k, v, key_mask)
        out_dtype = q.dtype
        q, k, v = _at_least_fp32(q), _at_least_fp32(k), _at_least_fp32(v)
        mask = None if key_mask is None else key_mask[:, None, None, :]  # (B, 1, 1, S)
        weights = attention_weights(attention_scores(q, k, mask), masked=mask is not None)  # (2), (3): (B, h, L, S)
        return (edit.apply(weights) @ v).to(out_dtype)  # the edit, then (4)


class MultiHeadSelfAttention(MultiHeadAttention):
    """Multi-head self-attention over tokens (B, N, C): a fused qkv projection, then `MultiHeadAttention`."""

    def __init__(
        self,
        dim: int,
        num_heads: int | None = None,
        head_dim: int | None = None,
        bias: bool = True,
        fused_attn: bool | None = None,
    ) -> None:
        super().__init__(dim, num_heads, head_dim, fused_attn)
        self.qkv = nn.Linear(dim, 3 * dim, bias=bias)
        self.proj = nn.Linear(dim, dim, bias=bias)

    def forward(self, x: torch.Tensor, spatial_size: tuple[int, int] | None = None) -> torch.Tensor:
        B, N, C = x.shape
        h, d = self.num_heads, self.head_dim
        # (1) project to queries, keys and values in one matmul, then split the heads
        qkv = self.qkv(x).reshape(B, N, 3, h, d).permute(2, 0, 3, 1, 4)  # (3, B, h, N, d)
        q, k, v = qkv.unbind(0)  # each (B, h, N, d)
        return self._attention(q, k, v, spatial_size)  # (B, N, C)


class MultiHeadCrossAttention(MultiHeadAttention):
    """Multi-head cross-attention: queries from tokens x (B, N, C), keys and values from `context` (B, L, context_dim).

    key_mask (B, L) bool, True = attend (diffusers' encoder_attention_mask as bools): padding tokens get weight
    zero. A row whose mask keeps no token (an empty prompt) attends nowhere: zero weights, and the layer's
    output for it is zero, so a residual block around it passes its input through unchanged.
    """

    kind = "cross"

    def __init__(
        self,
        dim: int,
        context_dim: int,
        num_heads: int | None = None,
        head_dim: int | None = None,
        bias: bool = True,
        fused_attn: bool | None = None,
    ) -> None:
        super().__init__(dim, num_heads, head_dim, fused_attn)
        self.context_dim = context_dim
        self.q = nn.Linear(dim, dim, bias=bias)
        self.kv = nn.Linear(context_dim, 2 * dim, bias=bias)
        self.proj = nn.Linear(dim, dim, bias=bias)

    def forward(
        self,
        x: torch.Tensor,
        context: torch.Tensor,
        key_mask: torch.Tensor | None = None,
        spatial_size: tuple[int, int] | None = None,
    ) -> torch.Tensor:
        B, N, C = x.shape
        L = context.shape[1]
        h, d = self.num_heads, self.head_dim
        # (1) queries from the pixels, keys and values from the prompt's tokens, heads split as in self-attention
        q = self.q(x).reshape(B, N, h, d).transpose(1, 2)  # (B, h, N, d)
        kv = self.kv(context).reshape(B, L, 2, h, d).permute(2, 0, 3, 1, 4)  # (2, B, h, L, d)
        k, v = kv.unbind(0)  # each (B, h, L, d)
        if key_mask is None:
            return self._attention(q, k, v, spatial_size)  # (B, N, C)
        empty = ~key_mask.any(dim=-1)  # (B,): prompts of nothing but padding
        # Such a row attends to every token instead, so no kernel meets a fully masked row (torch's CPU kernels
        # give it zeros, others need not), and its output is zeroed: the weights it records stay all zero.
        out = self._attention(q, k, v, spatial_size, key_mask, attend_mask=key_mask | empty[:, None])  # (B, N, C)
        return out.masked_fill_(empty[:, None, None], 0.0)  # in place: out is the projection's own new tensor


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
# The identity switch: weights = I, so the output of stages (2)-(4) is v
# --------------------------------------------------------------------------------------------


def _identity_rows(
    attend, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, heads: tuple[int, ...] | None, batch_start: int
) -> torch.Tensor:
    """Attention whose weights are the identity for batch rows batch_start.. (all heads, or `heads`).

    An identity weight matrix makes stage (4) return each pixel's own value: out = I · v = v. Rows before
    `batch_start` attend as usual; perturbed rows skip the attention when every head is switched.
    """
    keep = attend(q[:batch_start], k[:batch_start], v[:batch_start]) if batch_start > 0 else v[:0]  # (B0, h, N, d)
    if heads is None:
        return torch.cat([keep, v[batch_start:]])  # (B, h, N, d)
    part = attend(q[batch_start:], k[batch_start:], v[batch_start:]).clone()  # (B - B0, h, N, d)
    part[:, list(heads)] = v[batch_start:, list(heads)]
    return torch.cat([keep, part])


def _attention_modules(module: nn.Module, kind: str | None = None) -> dict[str, MultiHeadAttention]:
    """The attention layers inside `module` (of one kind, "self" or "cross", or all) by the name captures and the
    app show (e.g. "mid_attn")."""
    return {
        _record_name(n): m
        for n, m in module.named_modules()
        if isinstance(m, MultiHeadAttention) and kind in (None, m.kind)
    }


def attention_layer_names(module: nn.Module, kind: str = "self") -> list[str]:
    """Names of the attention layers inside `module`, as captures and the app show them (e.g. "mid_attn").

    kind: "self" (pixels attending to pixels: the layers `identity_attention` switches) or "cross" (pixels
    attending to a prompt's tokens, e.g. "mid_cross").
    """
    if kind not in ("self", "cross"):
        raise ValueError(f'kind must be "self" or "cross", got {kind!r}')
    return list(_attention_modules(module, kind))


_IDENTITY: contextvars.ContextVar[dict | None] = contextvars.ContextVar("denoiser_identity_attention", default=None)
_EDITS: contextvars.ContextVar[dict | None] = contextvars.ContextVar("denoiser_attention_edits", default=None)


@contextlib.contextmanager
def edit_attention(
    module: nn.Module, self_edit: AttentionEdit | None = None, cross_edit: AttentionEdit | None = None
) -> Iterator[None]:
    """Within, every self-attention layer of `module` runs with `self_edit` and every cross-attention layer with
    `cross_edit` (None: unedited), each call's batch rows as the edit's. A context variable, as captures."""
    edits = {m: self_edit if m.kind == "self" else cross_edit for m in _attention_modules(module).values()}
    token = _EDITS.set({**(_EDITS.get() or {}), **{m: e for m, e in edits.items() if e is not None}})
    try:
        yield
    finally:
        _EDITS.reset(token)


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
    by_name = _attention_modules(module, "self")
    if not by_name:
        raise ValueError(f"{type(module).__name__} contains no attention layers to switch")
    names = list(by_name) if layers is None else list(layers)
    unknown = [n for n in names if n not in by_name]
    cross = [n for n in unknown if n in _attention_modules(module, "cross")]
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
    active = _IDENTITY.get() or {}
    # a layer already switched off for every row and head (an ablation) stays off inside a narrower switch (PAG)
    chosen = {by_name[n]: (head_ids, batch_start) for n in names if active.get(by_name[n]) != (None, 0)}
    token = _IDENTITY.set({**active, **chosen})
    try:
        yield
    finally:
        _IDENTITY.reset(token)


# --------------------------------------------------------------------------------------------
# Capture: exact weights, rebuilt on demand
# --------------------------------------------------------------------------------------------


@dataclass
class AttentionRecord:
    """q and k of one attention call; `weights`, `scores` and `token_map` rebuild the weights exactly.

    A self-attention layer's keys are its pixels (S = N); a cross-attention layer's are the prompt's L tokens,
    so `weights(pixel)` is that pixel's weights over the tokens and `token_map(j)` token j's map over the pixels.
    """

    name: str  # module path inside the captured model, e.g. "down.1.attn.0" or "mid_cross"
    call_index: int  # order of this call among all recorded calls
    q: torch.Tensor  # (B, h, N, d): the queries, one per pixel
    k: torch.Tensor  # (B, h, S, d): the keys, S = N (self) or L prompt tokens (cross)
    scale: float
    size: tuple[int, int] | None  # (H, W) for pixel attention, None for plain token attention
    kind: str = "self"  # "self" or "cross", as the layer's `MultiHeadAttention.kind`
    key_mask: torch.Tensor | None = None  # (B, S) bool, True = attended; None: every key
    edit: AttentionEdit | None = None  # how the weights were changed after the softmax (weighting, prompt-to-prompt)

    @property
    def num_heads(self) -> int:
        return self.q.shape[1]

    def _row(self, query: int | tuple[int, int]) -> int:
        if isinstance(query, int):
            n = query
        else:
            if self.size is None:
                raise ValueError(f"layer {self.name} has no spatial size; pass the token index as an int")
            y, x = query
            H, W = self.size
            if not (0 <= y < H and 0 <= x < W):
                raise ValueError(f"query pixel {(y, x)} is outside layer {self.name}'s {H}x{W} grid")
            n = y * W + x
        if not 0 <= n < self.q.shape[2]:
            raise ValueError(f"query token {n} is outside 0..{self.q.shape[2] - 1} for layer {self.name}")
        return n

    def _scores(self, q: torch.Tensor) -> torch.Tensor:
        """Stage (2) for queries q (B, h, L, d) against every key, padding masked: (B, h, L, S) in fp32 or fp64."""
        mask = None if self.key_mask is None else self.key_mask[:, None, None, :]  # (B, 1, 1, S)
        return attention_scores(_at_least_fp32(q), _at_least_fp32(self.k), mask, scale=self.scale)

    def _weights(self, q: torch.Tensor) -> torch.Tensor:
        """Stage (3) for queries q (B, h, L, d), and the call's edit after it: the weights that ran, (B, h, L, S)."""
        weights = attention_weights(self._scores(q))
        return weights if self.edit is None else self.edit.apply(weights)

    def _on_pixels(self, row: torch.Tensor) -> torch.Tensor:
        """(B, h, N) values on the pixels -> (B, h, H, W) where the layer has a grid."""
        return row if self.size is None else row.reshape(*row.shape[:2], *self.size)

    def _on_keys(self, row: torch.Tensor) -> torch.Tensor:
        """(B, h, S) values on the keys -> (B, h, H, W) for a self-attention layer's pixels, (B, h, L) for tokens."""
        return self._on_pixels(row) if self.kind == "self" else row

    def scores(self, query: int | tuple[int, int]) -> torch.Tensor:
        """Stage (2) for one query: scaled q·kᵀ before the softmax, padding -inf; (B, h, H, W) over a self layer's
        pixels, (B, h, L) over a cross layer's tokens (or (B, h, N) without a grid)."""
        n = self._row(query)
        row = self._scores(self.q[:, :, n : n + 1])  # (B, h, 1, S)
        return self._on_keys(row.squeeze(2))

    def weights(self, query: int | tuple[int, int]) -> torch.Tensor:
        """Stage (3) for one query: its softmax weights over all keys. Each head's weights sum to one; padding
        tokens get zero, and a prompt of nothing but padding all zeros (its cross-attention adds nothing). A call
        that ran edited (weighted words, prompt-to-prompt) gives the edited weights, the ones that ran."""
        n = self._row(query)
        weights = self._weights(self.q[:, :, n : n + 1])  # (B, h, 1, S)
        return self._on_keys(weights.squeeze(2))

    def token_map(self, token: int) -> torch.Tensor:
        """Stage (3) seen from one key: the weight every pixel gives key `token`, (B, h, H, W) (or (B, h, N)).

        For a cross-attention layer, prompt token j's map over the image ("click a word, see its map"): one
        column of the (N, L) weights, each pixel's row softmaxed over all L tokens first. A padding token's map
        is zero. For a self-attention layer `token` is a key pixel's index (y·W + x). Costs O(N·S) per head.
        """
        S = self.k.shape[2]
        if not 0 <= token < S:
            raise ValueError(f"token {token} is outside 0..{S - 1} for layer {self.name} ({S} keys)")
        weights = self._weights(self.q)  # (B, h, N, S)
        return self._on_pixels(weights[..., token])


def _at_least_fp32(x: torch.Tensor) -> torch.Tensor:
    return x.float() if x.dtype in (torch.float16, torch.bfloat16) else x


def _record_name(module_name: str) -> str:
    # The attention sits inside its Spatial{Self,Cross}Attention as `.attention`; name the block, not the core.
    return module_name.removesuffix(".attention")


_CAPTURES: contextvars.ContextVar[dict | None] = contextvars.ContextVar("denoiser_attention_captures", default=None)


@contextlib.contextmanager
def capture_attention(module: nn.Module) -> Iterator[list[AttentionRecord]]:
    """Record every attention call inside `module` while the context is open.

    Yields a list that fills with one `AttentionRecord` per call, in call order: self- and cross-attention
    layers alike (`AttentionRecord.kind` tells them apart). The computation is untouched (records hold
    detached references to q, k and the padding mask), so outputs are bit-identical.
    """
    records: list[AttentionRecord] = []
    hooked = list(_attention_modules(module).items())
    if not hooked:
        raise ValueError(f"{type(module).__name__} contains no attention layers to capture")

    def make_recorder(name: str, kind: str):
        def record(q, k, scale, size, key_mask, edit):
            mask = None if key_mask is None else key_mask.detach()
            records.append(AttentionRecord(name, len(records), q.detach(), k.detach(), scale, size, kind, mask, edit))

        return record

    active = _CAPTURES.get() or {}
    for name, m in hooked:
        if m in active:
            raise RuntimeError(f"attention {name!r} is already being captured here; nested captures are not supported")
    # The recorders live in a context variable, not on the modules: a capture sees only the calls made in
    # its own thread (and context), so another thread sampling with the same model is never recorded.
    token = _CAPTURES.set({**active, **{m: make_recorder(name, m.kind) for name, m in hooked}})
    try:
        yield records
    finally:
        _CAPTURES.reset(token)

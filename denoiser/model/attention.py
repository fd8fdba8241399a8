"""Scaled dot-product attention, written as its four stages, and the multi-head layers built on them.

Vaswani et al. 2017, "Attention Is All You Need", eq. (1):

    (1) project tokens X to queries Q, keys K, values V with learned layers
    (2) scores  = Q Kᵀ / √d_k
    (3) weights = softmax(scores) over the keys, so each query's weights sum to one
    (4) output  = weights V

`scaled_dot_product_attention` is the readable reference for stages (2)-(4). The modules below use
torch's fused kernel on the fast path (`denoiser.fast` adds a CPU kernel for small heads) and this reference on the
readable one; a switch per module (`fused_attn`, as in timm) picks the path and the tests assert both compute the
same function.

Heads split the C channels into h groups of d = C / h. Cross-attention (Rombach et al. 2022, the conditioning of
Latent/Stable Diffusion) is the same attention with a different stage (1): queries from the pixel tokens, keys and
values from a prompt's L tokens (B, L, context_dim), projected to C channels. `MultiHeadAttention` holds what both
share: the head split, stages (2)-(4) on either path and the output projection; `MultiHeadSelfAttention` and
`MultiHeadCrossAttention` are only their stage (1). Padding tokens (a key mask, True = attend) get weight zero; a
prompt of nothing but padding attends nowhere, so its cross-attention adds nothing (its "no prompt").

Every call also reads three per-call settings of its layer (`LayerSettings`, a context variable each, so another
thread using the same model is untouched): a capture's recorder (`denoiser.model.attention_capture`), an edit of the
weights after the softmax (`denoiser.model.attention_edit.AttentionEdit`: the readable path applies it to the explicit
weights, the fast path moves it onto the values and stays fused) and identity weights, where each pixel attends
only to itself so stages (2)-(4) return v (perturbed-attention guidance, the ablations). The switches that set the
last two, and the U-Net's pixel blocks around these layers, are `denoiser.model.attention_blocks`.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
from collections.abc import Iterator

import torch
from torch import nn

from denoiser.fast.attention import sdpa as fast_sdpa
from denoiser.model.attention_edit import AttentionEdit

__all__ = [
    "scaled_dot_product_attention",
    "attention_scores",
    "attention_weights",
    "fused_attention",
    "AttentionHead",
    "MultiHeadAttention",
    "MultiHeadSelfAttention",
    "MultiHeadCrossAttention",
    "LayerSettings",
    "attention_layers",
    "attention_layer_names",
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
    q, k, v = at_least_fp32(q), at_least_fp32(k), at_least_fp32(v)
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


# --------------------------------------------------------------------------------------------
# Per-call settings of chosen layers: capture, edit, identity
# --------------------------------------------------------------------------------------------


class LayerSettings:
    """A setting per attention layer ({MultiHeadAttention: setting}) for the calls made inside a `with`.

    The settings live in a context variable, not on the modules: a setting made in one thread (or context) never
    reaches a call that another thread makes with the same model, as a web server's threads need.
    """

    def __init__(self, name: str) -> None:
        self._var: contextvars.ContextVar[dict | None] = contextvars.ContextVar(name, default=None)

    def active(self) -> dict:
        """Every layer's setting in this context."""
        return self._var.get() or {}

    def get(self, layer: nn.Module):
        """`layer`'s setting in this context, None if it has none."""
        active = self._var.get()
        return None if active is None else active.get(layer)

    @contextlib.contextmanager
    def set(self, settings: dict) -> Iterator[None]:
        """Within, `settings` on top of the active ones (a layer named in both takes the new one)."""
        token = self._var.set({**self.active(), **settings})
        try:
            yield
        finally:
            self._var.reset(token)


CAPTURES = LayerSettings("denoiser_attention_captures")  # recorder(q, k, scale, size, key_mask, edit): capture_attention
EDITS = LayerSettings("denoiser_attention_edits")  # an AttentionEdit: attention_blocks.edit_attention
IDENTITY = LayerSettings("denoiser_identity_attention")  # (heads or None, batch_start): attention_blocks.identity_attention


class MultiHeadAttention(nn.Module):
    """What every attention layer shares after stage (1): h heads over the C channels, stages (2)-(4) on the
    fused or the readable path, the per-call settings (capture, edit, identity), heads concatenated and the output
    projection.

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
        return CAPTURES.get(self)

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
        edit = EDITS.get(self)
        if self._recorder is not None:
            self._recorder(q, k, self.scale, spatial_size, key_mask, edit)
        identity = IDENTITY.get(self)
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
        q, k, v = at_least_fp32(q), at_least_fp32(k), at_least_fp32(v)
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


# --------------------------------------------------------------------------------------------
# Identity weights (stages (2)-(4) return v), and a model's attention layers by name
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


def attention_layers(module: nn.Module, kind: str | None = None) -> dict[str, MultiHeadAttention]:
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
    return list(attention_layers(module, kind))


def at_least_fp32(x: torch.Tensor) -> torch.Tensor:
    """fp16/bf16 -> fp32 (the readable path computes as the fused kernels accumulate); other dtypes unchanged."""
    return x.float() if x.dtype in (torch.float16, torch.bfloat16) else x


def _record_name(module_name: str) -> str:
    # The attention sits inside its Spatial{Self,Cross}Attention as `.attention`; name the block, not the core.
    return module_name.removesuffix(".attention")

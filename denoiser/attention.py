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

`capture_attention(model)` records q and k of every attention call (O(N·d) memory, never the N×N
matrix) without touching the computation, so any query pixel's exact weights can be rebuilt later.

`identity_attention(model, layers)` is the one switch that turns chosen layers' (or heads') weights into
the identity matrix: each pixel attends only to itself, so stages (2)-(4) return v. Perturbed-attention
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

from denoiser.fast.attention import sdpa as fast_sdpa
from denoiser.groupnorm import GroupNorm

__all__ = [
    "scaled_dot_product_attention",
    "attention_scores",
    "AttentionHead",
    "MultiHeadSelfAttention",
    "SpatialSelfAttention",
    "AttentionRecord",
    "capture_attention",
    "identity_attention",
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
    # (3) softmax over keys; a fully masked row has max -inf and would give NaN: make it zero
    weights = torch.softmax(scores, dim=-1)
    if attn_mask is not None or is_causal:  # only a mask can hide every key of a row
        fully_masked = torch.isneginf(scores).all(dim=-1, keepdim=True)  # (..., L, 1)
        weights = weights.masked_fill(fully_masked, 0.0)
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


def fused_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Stages (2)-(4) on the fast path, (B, h, N, d) -> (B, h, N, d): torch's fused SDPA, or for CPU
    inference with small heads the speed layer's kernel (`denoiser.fast.attention`), the same function."""
    return fast_sdpa(q, k, v)


class MultiHeadSelfAttention(nn.Module):
    """Multi-head self-attention over tokens (B, N, C): fused qkv projection, h heads, output projection.

    Head i uses channels [i·d, (i+1)·d) of each of q, k and v: exactly `num_heads` `AttentionHead`s
    whose outputs are concatenated, then projected.

    fused_attn: True uses the fused path (`fused_attention`); False the readable reference. None (default) picks
    the faster correct path per device and dtype: the reference for CPU training in fp16/bf16,
    where torch's fused CPU backward is several times slower for short sequences, fused otherwise.
    """

    def __init__(
        self,
        dim: int,
        num_heads: int | None = None,
        head_dim: int | None = None,
        bias: bool = True,
        fused_attn: bool | None = None,
    ) -> None:
        super().__init__()
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
        self.dim = dim
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.scale = self.head_dim**-0.5
        self.fused_attn = fused_attn
        self.qkv = nn.Linear(dim, 3 * dim, bias=bias)
        self.proj = nn.Linear(dim, dim, bias=bias)

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

    def forward(self, x: torch.Tensor, spatial_size: tuple[int, int] | None = None) -> torch.Tensor:
        B, N, C = x.shape
        h, d = self.num_heads, self.head_dim
        # (1) project to queries, keys and values in one matmul, then split the heads
        qkv = self.qkv(x).reshape(B, N, 3, h, d).permute(2, 0, 3, 1, 4)  # (3, B, h, N, d)
        q, k, v = qkv.unbind(0)  # each (B, h, N, d)
        if self._recorder is not None:
            self._recorder(q, k, self.scale, spatial_size)
        switch = _IDENTITY.get()
        identity = None if switch is None else switch.get(self)
        if identity is None:
            out = self._attend(q, k, v)  # (B, h, N, d)
        else:
            out = _identity_rows(self._attend, q, k, v, *identity)  # (B, h, N, d)
        out = out.transpose(1, 2).reshape(B, N, C)  # (B, N, h·d): heads concatenated
        return self.proj(out)

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """(2)-(4) on the fast or the readable path, (B, h, N, d) -> (B, h, N, d)."""
        if self._use_fused(q):
            return fused_attention(q, k, v)
        return scaled_dot_product_attention(q, k, v)


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
        if channels % norm_num_groups:
            raise ValueError(f"norm_num_groups={norm_num_groups} must divide the channels ({channels})")
        self.norm = GroupNorm(norm_num_groups, channels, eps=1e-6)
        self.attention = MultiHeadSelfAttention(channels, num_heads, head_dim, fused_attn=fused_attn)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, C, H, W = x.shape
        tokens = to_tokens(self.norm(x))  # (B, N, C)
        out = self.attention(tokens, spatial_size=(H, W))  # (B, N, C)
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


def _attention_modules(module: nn.Module) -> dict[str, MultiHeadSelfAttention]:
    """The attention layers inside `module` by the name captures and the app show (e.g. "mid_attn")."""
    return {_record_name(n): m for n, m in module.named_modules() if isinstance(m, MultiHeadSelfAttention)}


def attention_layer_names(module: nn.Module) -> list[str]:
    """Names of the attention layers inside `module`, as captures and the app show them (e.g. "mid_attn")."""
    return list(_attention_modules(module))


_IDENTITY: contextvars.ContextVar[dict | None] = contextvars.ContextVar("denoiser_identity_attention", default=None)


@contextlib.contextmanager
def identity_attention(
    module: nn.Module,
    layers: Iterable[str] | None = None,
    heads: Iterable[int] | None = None,
    batch_start: int = 0,
) -> Iterator[None]:
    """Within, the chosen attention layers of `module` use identity weights (each pixel attends to itself).

    layers: names from `attention_layer_names` (None: every layer); heads: head indices switched in
    each chosen layer (None: all); batch_start: only batch rows from this index on are perturbed. Like
    captures, the switch lives in a context variable: other threads using the same model are untouched.
    """
    by_name = _attention_modules(module)
    if not by_name:
        raise ValueError(f"{type(module).__name__} contains no attention layers to switch")
    names = list(by_name) if layers is None else list(layers)
    unknown = [n for n in names if n not in by_name]
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
    """q and k of one attention call; `weights` and `scores` rebuild any query row exactly."""

    name: str  # module path inside the captured model, e.g. "down.1.attn.0"
    call_index: int  # order of this call among all recorded calls
    q: torch.Tensor  # (B, h, N, d)
    k: torch.Tensor  # (B, h, N, d)
    scale: float
    size: tuple[int, int] | None  # (H, W) for pixel attention, None for plain token attention

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

    def _shape(self, row: torch.Tensor) -> torch.Tensor:
        if self.size is None:
            return row  # (B, h, N)
        return row.reshape(*row.shape[:2], *self.size)  # (B, h, H, W)

    def scores(self, query: int | tuple[int, int]) -> torch.Tensor:
        """Stage (2) for one query: scaled q·kᵀ before the softmax, (B, h, H, W) (or (B, h, N))."""
        n = self._row(query)
        q, k = _at_least_fp32(self.q[:, :, n : n + 1]), _at_least_fp32(self.k)  # (B, h, 1, d), (B, h, N, d)
        row = attention_scores(q, k, scale=self.scale)  # (B, h, 1, N)
        return self._shape(row.squeeze(2))

    def weights(self, query: int | tuple[int, int]) -> torch.Tensor:
        """Stage (3) for one query: its softmax weights over all keys, each head's map sums to one."""
        scores = self.scores(query)
        flat = scores.flatten(2)  # (B, h, N)
        return torch.softmax(flat, dim=-1).reshape(scores.shape)


def _at_least_fp32(x: torch.Tensor) -> torch.Tensor:
    return x.float() if x.dtype in (torch.float16, torch.bfloat16) else x


def _record_name(module_name: str) -> str:
    # The attention sits inside its SpatialSelfAttention as `.attention`; name the block, not the core.
    return module_name.removesuffix(".attention")


_CAPTURES: contextvars.ContextVar[dict | None] = contextvars.ContextVar("denoiser_attention_captures", default=None)


@contextlib.contextmanager
def capture_attention(module: nn.Module) -> Iterator[list[AttentionRecord]]:
    """Record every attention call inside `module` while the context is open.

    Yields a list that fills with one `AttentionRecord` per call, in call order. The computation is
    untouched (records hold detached references to q and k), so outputs are bit-identical.
    """
    records: list[AttentionRecord] = []
    hooked = list(_attention_modules(module).items())
    if not hooked:
        raise ValueError(f"{type(module).__name__} contains no MultiHeadSelfAttention to capture")

    def make_recorder(name: str):
        def record(q, k, scale, size):
            records.append(AttentionRecord(name, len(records), q.detach(), k.detach(), scale, size))

        return record

    active = _CAPTURES.get() or {}
    for name, m in hooked:
        if m in active:
            raise RuntimeError(f"attention {name!r} is already being captured here; nested captures are not supported")
    # The recorders live in a context variable, not on the modules: a capture sees only the calls made in
    # its own thread (and context), so another thread sampling with the same model is never recorded.
    token = _CAPTURES.set({**active, **{m: make_recorder(name) for name, m in hooked}})
    try:
        yield records
    finally:
        _CAPTURES.reset(token)

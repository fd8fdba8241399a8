"""Capture: the q and k of every attention call, from which its exact weights are rebuilt on demand.

`capture_attention(model)` records q and k of every attention call (O(N·d) memory, never the N×N matrix) without
touching the computation, so any query pixel's exact weights can be rebuilt later (stages (2) and (3) of
`denoiser.model.attention`), and for a cross-attention layer any prompt token's map over the pixels
(`AttentionRecord.token_map`). A call that ran with an edit (`denoiser.model.attention_blocks.edit_attention`) records it,
so the rebuilt weights are the ones that ran.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import nn

from denoiser.fast.precision import full_precision
from denoiser.model.attention import CAPTURES, at_least_fp32, attention_layers, attention_scores, attention_weights
from denoiser.model.attention_edit import AttentionEdit

__all__ = ["AttentionRecord", "capture_attention"]


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
        return attention_scores(at_least_fp32(q), at_least_fp32(self.k), mask, scale=self.scale)

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


@contextlib.contextmanager
def capture_attention(module: nn.Module) -> Iterator[list[AttentionRecord]]:
    """Record every attention call inside `module` while the context is open.

    Yields a list that fills with one `AttentionRecord` per call, in call order: self- and cross-attention
    layers alike (`AttentionRecord.kind` tells them apart). The computation is the float32 one (a bf16 autocast
    around it, denoiser.fast.precision, is switched off inside, so the weights are exact) and is otherwise untouched
    (records hold detached references to q, k and the padding mask): outputs are bit-identical to float32's.
    """
    records: list[AttentionRecord] = []
    hooked = list(attention_layers(module).items())
    if not hooked:
        raise ValueError(f"{type(module).__name__} contains no attention layers to capture")

    def make_recorder(name: str, kind: str):
        def record(q, k, scale, size, key_mask, edit):
            mask = None if key_mask is None else key_mask.detach()
            records.append(AttentionRecord(name, len(records), q.detach(), k.detach(), scale, size, kind, mask, edit))

        return record

    active = CAPTURES.active()
    for name, m in hooked:
        if m in active:
            raise RuntimeError(f"attention {name!r} is already being captured here; nested captures are not supported")
    # The recorders live in a context variable, not on the modules: a capture sees only the calls made in
    # its own thread (and context), so another thread sampling with the same model is never recorded.
    with full_precision(), CAPTURES.set({m: make_recorder(name, m.kind) for name, m in hooked}):
        yield records

"""Changing attention weights after the softmax: the one rule behind prompt weighting and prompt-to-prompt.

Stage (3) gives each query row its weights W[b, :, n, :] (heads, queries, keys). An `AttentionEdit` changes them,
per batch row b and key j, before stage (4):

    W'[b, :, n, j] = scale[b, j] · ( W[source[b], :, n, key_map[b, j]]   if key_map[b, j] >= 0
                                     W[b, :, n, j]                          otherwise )

- `scale` alone is prompt weighting ("(red:1.5) apple"): key j's weight times w, the others unchanged, as
  prompt-to-prompt's reweight (Hertz et al. 2022). The row then sums to 1 + Σ (w_j − 1)·W_j.
- `source` and `key_map` are prompt-to-prompt's injection: row b takes another row's weights (the source
  image's, same query pixel) for the keys it maps. Self-attention maps every pixel to itself (the source's
  self-attention maps); cross-attention maps a target word to the source word it replaces, and a new word
  (-1) keeps its own weight ("refine").

`apply` is that rule on explicit weights: the readable path and the records (`AttentionRecord`) use it.
`fused` computes the same output without forming W: since W'·v = Σ_j W'_j v_j, the scale and the key map can
be moved onto the values, and the output is one fused SDPA with the row's own q, k (for its own keys) plus one
with the source's q, k (for the keys it takes from the source). Both are the same function (tests/model/test_attention_edit.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

__all__ = ["AttentionEdit"]


@dataclass(frozen=True)
class AttentionEdit:
    """How one attention call's weights change, per batch row (the module docstring's rule)."""

    scale: torch.Tensor | None = None  # (B, S) each key's factor after the softmax; None: 1
    source: torch.Tensor | None = None  # (B,) long: the row whose weights row b takes; -1: none
    key_map: torch.Tensor | None = None  # (B, S) long: the source's key that key j takes its weight from, -1: its
    #                                      own; None with a source: every key its own index (self-attention's pixels)

    def __post_init__(self) -> None:
        if self.key_map is not None and self.source is None:
            raise ValueError("an attention edit's key map needs the source rows it maps into")

    def first_rows(self, n: int) -> AttentionEdit:
        """The edit of the batch's first n rows alone; their sources must lie among them (a guided batch's prompts'
        rows come first, and an edit's source is image 0)."""
        if self.source is not None and bool((self.source[:n] >= n).any()):
            raise ValueError(f"the first {n} rows take weights from rows past them: they cannot be cut apart")

        def rows(x: torch.Tensor | None) -> torch.Tensor | None:
            return None if x is None else x[:n]

        return AttentionEdit(scale=rows(self.scale), source=rows(self.source), key_map=rows(self.key_map))

    def _taken(self, B: int, S: int, device) -> torch.Tensor:
        """(B, S) bool: which keys of which rows take their weight from a source row."""
        if self.source is None:
            return torch.zeros(B, S, dtype=torch.bool, device=device)
        has = (self.source >= 0)[:, None]  # (B, 1)
        return has.expand(B, S) if self.key_map is None else has & (self.key_map >= 0)

    def _index(self, B: int, S: int, device) -> torch.Tensor:
        """(B, S) long: the source key each key maps to (itself where there is no map)."""
        if self.key_map is None:
            return torch.arange(S, device=device).expand(B, S)
        return self.key_map.clamp(min=0)

    def _factors(self, v: torch.Tensor, taken: torch.Tensor, keep: bool) -> torch.Tensor:
        """(B, 1, S, 1) per key: its scale where it keeps its own weight (keep) or takes the source's (not keep)."""
        B, _, S, _ = v.shape
        scale = torch.ones(B, S, dtype=v.dtype, device=v.device) if self.scale is None else self.scale.to(v.dtype)
        return (scale * (taken != keep).to(v.dtype))[:, None, :, None]  # (B, 1, S, 1)

    def apply(self, weights: torch.Tensor) -> torch.Tensor:
        """The rule on explicit weights (B, h, L, S) -> (B, h, L, S): each row's own or its source row's weights."""
        out = weights
        if self.source is not None:
            B, h, L, S = weights.shape
            src = weights[self.source.clamp(min=0)]  # (B, h, L, S): each row's source row
            index = self._index(B, S, weights.device)[:, None, None, :].expand(B, h, L, S)
            taken = self._taken(B, S, weights.device)  # (B, S)
            out = torch.where(taken[:, None, None, :], src.gather(-1, index), weights)
        if self.scale is not None:
            out = out * self.scale[:, None, None, :].to(out.dtype)
        return out

    def fused(
        self,
        attend: Callable[..., torch.Tensor],
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        mask: torch.Tensor | None,
    ) -> torch.Tensor:
        """The edited attention's output through `attend(q, k, v, mask)` (a fused SDPA), never forming the weights.

        q (B, h, L, d), k and v (B, h, S, d), mask (B, S) bool or None -> (B, h, L, d)."""
        B, _, S, _ = v.shape
        taken = self._taken(B, S, v.device)  # (B, S)
        out = attend(q, k, v * self._factors(v, taken, keep=True), mask)  # the keys that keep their own weight
        rows = taken.any(dim=1).nonzero().flatten()  # the rows that take weights from a source
        if rows.numel() == 0:
            return out
        src = self.source[rows]
        # key j's value, scaled, moved to the source key it takes its weight from (summed where several map to one)
        moved = v[rows] * self._factors(v, taken, keep=False)[rows]  # (R, h, S, d)
        index = self._index(B, S, v.device)[rows][:, None, :, None].expand_as(moved)  # (R, h, S, d)
        src_v = torch.zeros_like(moved).scatter_add(2, index, moved)  # (R, h, S, d), the source's keys
        from_source = attend(q[src], k[src], src_v, None if mask is None else mask[src])  # (R, h, L, d)
        return out.index_add(0, rows, from_source)

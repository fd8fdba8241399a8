"""Scaled dot-product attention for small heads on a CPU (`csrc/attention_small_head.cpp`).

For self-attention with head sizes d = 16 and 32, torch's flash kernel spends about half its time around GEMM
calls of inner size d; this kernel does the same three stages (scores, softmax, weights @ v) per block of queries in
registers. It takes fp32, or bf16 (what the projections give under bf16 autocast: read into fp32, computed in fp32,
the output rounded to bf16 once; a bf16 UNet call 1.15x faster than with torch's bf16 flash kernel on a Zen 5,
bench/precision_mix.md). Inference only (no backward). `sdpa` takes it where it applies and calls torch's
fused SDPA everywhere else, so it computes the same function as `F.scaled_dot_product_attention`
(tests/model/test_attention.py: against float64, as accurate as torch's own).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from denoiser.fast.kernels import load_kernels, plain_tensors, tracing

__all__ = ["sdpa", "small_head_kernel"]


def small_head_kernel() -> bool:
    """Whether denoiser's small-head attention kernel is here: the kernels built, on an AVX-512 CPU."""
    return load_kernels() and torch.ops.denoiser.small_head_attention_compiled()


def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: torch.Tensor | None = None) -> torch.Tensor:
    """softmax(q kᵀ / √d) v, (B, h, L, d), (B, h, S, d) -> (B, h, L, d): the small-head kernel for CPU inference of
    self-attention (L = S, no mask), torch's fused SDPA otherwise (masks, cross-attention, training, other
    devices, compilation, transforms)."""
    if (
        not tracing()  # first: tracing sees none of the checks below
        and attn_mask is None
        and q.shape == k.shape
        and q.device.type == "cpu"
        and not (torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad))
        and plain_tensors(q, k, v)
        and small_head_kernel()
    ):
        return torch.ops.denoiser.small_head_attention(q, k, v)  # falls back to torch's SDPA for other d
    return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)

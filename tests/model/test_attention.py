"""The four stages against torch SDPA in float64; modules against per-head references."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from denoiser.model.attention import (
    AttentionHead,
    MultiHeadSelfAttention,
    fused_attention,
    scaled_dot_product_attention,
)

SHAPES = [  # (batch dims, L, S, d, d_v): awkward sizes, L != S, head dims 1..80
    ((2, 3), 7, 7, 1, 1),
    ((1, 4), 17, 9, 12, 12),
    ((3,), 113, 203, 40, 24),
    ((2, 2), 64, 64, 80, 80),
    ((), 5, 11, 12, 7),
]


@pytest.mark.parametrize("batch,L,S,d,dv", SHAPES)
@pytest.mark.parametrize("mask", ["none", "bool", "float", "causal"])
def test_reference_matches_torch_sdpa_float64(batch, L, S, d, dv, mask):
    g = torch.Generator().manual_seed(L * 31 + S)
    q = torch.randn(*batch, L, d, generator=g, dtype=torch.float64)
    k = torch.randn(*batch, S, d, generator=g, dtype=torch.float64)
    v = torch.randn(*batch, S, dv, generator=g, dtype=torch.float64)
    kwargs = {}
    if mask == "bool":
        kwargs["attn_mask"] = torch.rand(L, S, generator=g) > 0.3  # broadcast over batch dims
    elif mask == "float":
        kwargs["attn_mask"] = torch.randn(*batch[-1:], L, S, generator=g, dtype=torch.float64)
    elif mask == "causal":
        kwargs["is_causal"] = True
    ours = scaled_dot_product_attention(q, k, v, **kwargs)
    ref = F.scaled_dot_product_attention(q, k, v, **kwargs)
    torch.testing.assert_close(ours, ref, rtol=1e-10, atol=1e-10)


def test_custom_scale_and_weights_sum_to_one():
    q, k, v = (torch.randn(2, 3, 10, 8, dtype=torch.float64) for _ in range(3))
    out, w = scaled_dot_product_attention(q, k, v, scale=0.3, return_weights=True)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, scale=0.3))
    torch.testing.assert_close(w.sum(-1), torch.ones(2, 3, 10, dtype=torch.float64))
    # stage by stage: scores -> softmax -> weighted sum
    torch.testing.assert_close(w, torch.softmax(q @ k.transpose(-2, -1) * 0.3, dim=-1))
    torch.testing.assert_close(out, w @ v)


def test_fully_masked_row_gives_zero_not_nan():
    q = torch.randn(1, 4, 8, dtype=torch.float64)
    k, v = (torch.randn(1, 6, 8, dtype=torch.float64) for _ in range(2))
    mask = torch.ones(4, 6, dtype=torch.bool)
    mask[2] = False
    out, w = scaled_dot_product_attention(q, k, v, attn_mask=mask, return_weights=True)
    assert torch.isfinite(out).all() and torch.isfinite(w).all()
    assert (out[0, 2] == 0).all() and (w[0, 2] == 0).all()
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, attn_mask=mask))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_low_precision_accumulates_in_fp32(dtype):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 4, 50, 24, generator=g) for _ in range(3))
    ref = F.scaled_dot_product_attention(q.double(), k.double(), v.double())
    ours = scaled_dot_product_attention(q.to(dtype), k.to(dtype), v.to(dtype))
    torch_low = F.scaled_dot_product_attention(q.to(dtype), k.to(dtype), v.to(dtype))
    assert ours.dtype == dtype
    err_ours = (ours.double() - ref).abs().max()
    err_torch = (torch_low.double() - ref).abs().max()
    assert err_ours <= 2 * err_torch + 1e-3  # at most ~2x as wrong as torch itself in that precision


def test_mask_and_causal_together_is_an_error():
    q = torch.randn(1, 3, 4)
    with pytest.raises(ValueError, match="not both"):
        scaled_dot_product_attention(q, q, q, attn_mask=torch.ones(3, 3, dtype=torch.bool), is_causal=True)


def test_attention_head_returns_output_and_probs():
    head = AttentionHead(48, 12).double()
    x = torch.randn(2, 64, 48, dtype=torch.float64)
    out, probs = head(x)
    assert out.shape == (2, 64, 12) and probs.shape == (2, 64, 64)
    torch.testing.assert_close(probs.sum(-1), torch.ones(2, 64, dtype=torch.float64))
    q, k, v = head.query(x), head.key(x), head.value(x)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v))


def _heads_from(mhsa: MultiHeadSelfAttention) -> list[AttentionHead]:
    """Per-head modules holding exactly the slices of the fused qkv projection."""
    C, d = mhsa.dim, mhsa.head_dim
    heads = []
    for i in range(mhsa.num_heads):
        head = AttentionHead(C, d).to(mhsa.qkv.weight.dtype)
        for j, lin in enumerate((head.query, head.key, head.value)):
            rows = slice(j * C + i * d, j * C + (i + 1) * d)
            lin.weight.data.copy_(mhsa.qkv.weight[rows])
            lin.bias.data.copy_(mhsa.qkv.bias[rows])
        heads.append(head)
    return heads


@pytest.mark.parametrize("fused", [True, False])
def test_vit_example_multi_head_equals_concatenated_heads(fused):
    # A 32x32x3 image cut into 4x4 patches: 64 tokens of 48 values; 4 heads of 12 dims.
    img = torch.randn(2, 3, 32, 32, dtype=torch.float64)
    patches = img.unfold(2, 4, 4).unfold(3, 4, 4)  # (B, 3, 8, 8, 4, 4)
    tokens = patches.permute(0, 2, 3, 1, 4, 5).reshape(2, 64, 48)  # (B, N=64, 3*4*4=48)
    mhsa = MultiHeadSelfAttention(48, num_heads=4, fused_attn=fused).double()
    assert mhsa.head_dim == 12
    heads = _heads_from(mhsa)
    concat = torch.cat([h(tokens)[0] for h in heads], dim=-1)  # (B, 64, 48)
    torch.testing.assert_close(mhsa(tokens), mhsa.proj(concat))


def test_fused_and_readable_paths_agree():
    mhsa = MultiHeadSelfAttention(40, head_dim=8)
    assert mhsa.num_heads == 5
    x = torch.randn(3, 113, 40)
    mhsa.fused_attn = True
    fused = mhsa(x)
    mhsa.fused_attn = False
    manual = mhsa(x)
    torch.testing.assert_close(fused, manual, rtol=1e-5, atol=1e-5)


def _qkv(B, N, h, d, seed=0):
    """q, k, v as the attention slices them from its qkv projection: strided (B, h, N, d) views."""
    torch.manual_seed(seed)
    qkv = torch.randn(B, N, 3, h, d).permute(2, 0, 3, 1, 4)  # (3, B, h, N, d)
    return qkv[0], qkv[1], qkv[2]


def _small_head_here() -> bool:
    from denoiser.fast.attention import small_head_kernel

    return small_head_kernel()


needs_small_head = pytest.mark.skipif(
    not _small_head_here(), reason="the small-head attention kernel is built only for AVX-512 CPUs (and needs the "
    "C++ kernels built): here fused_attention calls torch's SDPA, tested above"
)


@needs_small_head
@pytest.mark.parametrize("B,N,h,d", [(2, 256, 4, 16), (3, 64, 2, 16), (2, 49, 3, 32), (1, 1, 1, 16), (2, 17, 2, 16)])
def test_small_head_kernel_matches_float64(B, N, h, d):
    # the CPU fast path for d = 16, 32 (csrc/attention_small_head.cpp): as accurate as torch's own SDPA
    q, k, v = _qkv(B, N, h, d)
    ref = F.scaled_dot_product_attention(q.double(), k.double(), v.double())
    with torch.inference_mode():
        ours = torch.ops.denoiser.small_head_attention(q, k, v)
        torch_err = (F.scaled_dot_product_attention(q, k, v) - ref).abs().max().item()
        assert torch.equal(fused_attention(q, k, v), ours)
    assert ours.shape == (B, h, N, d) and ours.transpose(1, 2).is_contiguous()  # heads concatenate for free
    assert (ours - ref).abs().max().item() <= 2 * torch_err + 1e-7


@needs_small_head
@pytest.mark.parametrize("B,N,h,d", [(2, 256, 4, 16), (3, 64, 2, 32), (2, 49, 3, 32), (2, 17, 2, 16)])
def test_small_head_kernel_in_bfloat16_is_the_float64_result_rounded_once(B, N, h, d):
    # bf16 q, k, v (what bf16 autocast's projections give): read into fp32, the four stages in fp32, the output
    # rounded to bf16 once, so its error is that of rounding the exact result (torch's bf16 flash kernel's is larger)
    q, k, v = (t.to(torch.bfloat16) for t in _qkv(B, N, h, d))
    ref = F.scaled_dot_product_attention(q.double(), k.double(), v.double())
    with torch.inference_mode():
        ours = torch.ops.denoiser.small_head_attention(q, k, v)
        assert torch.equal(fused_attention(q, k, v), ours)
    assert ours.dtype == torch.bfloat16 and ours.shape == (B, h, N, d)
    rounding = (ref.to(torch.bfloat16).double() - ref).abs().max().item()
    assert (ours.double() - ref).abs().max().item() <= rounding + 1e-6
    with pytest.raises(RuntimeError, match="same dtype"):  # dtypes that differ go to torch's SDPA, which refuses
        torch.ops.denoiser.small_head_attention(q, k.float(), v)


@needs_small_head
def test_small_head_kernel_propagates_nan_and_falls_back_elsewhere():
    q, k, v = _qkv(2, 40, 2, 16)
    q[1, 0, 7, 3] = float("nan")
    with torch.inference_mode():
        out = torch.ops.denoiser.small_head_attention(q, k, v)
        assert torch.isnan(out[1, 0, 7]).all() and torch.isfinite(out[1, 0, :7]).all() and torch.isfinite(out[0]).all()
        for other in (_qkv(2, 40, 2, 24), _qkv(2, 40, 2, 16)[0].double()):  # a head size or dtype it does not cover
            q, k, v = other if isinstance(other, tuple) else (other, other, other)
            assert torch.equal(torch.ops.denoiser.small_head_attention(q, k, v), F.scaled_dot_product_attention(q, k, v))
    # with gradients the module path uses torch's SDPA, which has a backward
    q, k, v = (t.clone().requires_grad_() for t in _qkv(1, 8, 1, 16))
    fused_attention(q, k, v).sum().backward()
    assert q.grad is not None and torch.isfinite(q.grad).all()


def test_bad_head_configuration_is_explained():
    with pytest.raises(ValueError, match="num_heads must divide"):
        MultiHeadSelfAttention(48, num_heads=5)
    with pytest.raises(ValueError, match="head_dim must divide"):
        MultiHeadSelfAttention(48, head_dim=7)

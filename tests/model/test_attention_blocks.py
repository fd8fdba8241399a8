"""denoiser/model/attention_blocks.py: pixel tokens and the residual pixel-attention block."""

from __future__ import annotations

import pytest
import torch

from denoiser.model.attention_blocks import SpatialSelfAttention, from_tokens, to_tokens


def test_tokens_round_trip_row_major():
    x = torch.arange(2 * 3 * 4 * 5.0).reshape(2, 3, 4, 5)
    t = to_tokens(x)
    assert t.shape == (2, 20, 3)
    assert torch.equal(t[:, 1 * 5 + 2], x[:, :, 1, 2])  # token n = y*W + x
    assert torch.equal(from_tokens(t, 4, 5), x)


@pytest.mark.parametrize("num_heads", [1, 4])
def test_spatial_attention_is_residual_pixel_attention(num_heads):
    torch.manual_seed(0)
    block = SpatialSelfAttention(32, num_heads=num_heads, norm_num_groups=8).double()
    x = torch.randn(2, 32, 6, 5, dtype=torch.float64)
    h = block.norm(x).flatten(2).transpose(1, 2)  # (B, 30, 32)
    expected = x + block.attention(h).transpose(1, 2).reshape(2, 32, 6, 5)
    torch.testing.assert_close(block(x), expected)

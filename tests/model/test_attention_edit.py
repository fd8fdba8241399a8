"""Edited attention weights (denoiser/model/attention_edit.py, `edit_attention`): the rule on explicit weights against a
loop written from its definition in float64, the fused path (the edit moved onto v) against the readable one, the
attention modules on both paths, and captures that return the weights that ran."""

from __future__ import annotations

import pytest
import torch

from denoiser.model.attention import (
    MultiHeadCrossAttention,
    MultiHeadSelfAttention,
    attention_scores,
    attention_weights,
)
from denoiser.model.attention_blocks import edit_attention, identity_attention
from denoiser.model.attention_capture import capture_attention
from denoiser.model.attention_edit import AttentionEdit


def _sdpa(q, k, v, mask):
    m = None if mask is None else mask[:, None, None, :]
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=m)


def _random_edit(B: int, S: int, g: torch.Generator, dtype=torch.float64) -> AttentionEdit:
    """Scales in [0, 2], rows 1.. take row 0's or row 1's weights; keys map anywhere (several onto one) or keep their own."""
    scale = torch.rand(B, S, generator=g, dtype=dtype) * 2
    source = torch.tensor([-1] + [int(torch.randint(0, 2, (), generator=g)) if b > 1 else 0 for b in range(1, B)])
    key_map = torch.randint(-1, S, (B, S), generator=g)
    return AttentionEdit(scale=scale, source=source, key_map=key_map)


def _by_definition(weights: torch.Tensor, edit: AttentionEdit) -> torch.Tensor:
    """W'[b, :, n, j] = scale[b, j] · (W[source[b], :, n, key_map[b, j]] if mapped, else W[b, :, n, j]), one entry at a time."""
    B, _, _, S = weights.shape
    out = weights.clone()
    for b in range(B):
        for j in range(S):
            src, i = int(edit.source[b]), int(edit.key_map[b, j])
            if src >= 0 and i >= 0:
                out[b, :, :, j] = weights[src, :, :, i]
            out[b, :, :, j] *= edit.scale[b, j]
    return out


@pytest.mark.parametrize("L, S, d", [(113, 7, 5), (16, 16, 3), (1, 3, 8)])
def test_the_rule_and_its_fused_form_match_the_definition_in_float64(L, S, d):
    g = torch.Generator().manual_seed(L + S)
    B, h = 4, 3
    q, k, v = (torch.randn(B, h, n, d, generator=g, dtype=torch.float64) for n in (L, S, S))
    mask = torch.rand(B, S, generator=g) > 0.3
    mask[:, 0] = True  # every row keeps a key (a fully masked row is the cross layer's own concern)
    edit = _random_edit(B, S, g)
    weights = attention_weights(attention_scores(q, k, mask[:, None, None, :]))  # (B, h, L, S)
    expected = _by_definition(weights, edit)
    torch.testing.assert_close(edit.apply(weights), expected, rtol=0, atol=1e-15)
    torch.testing.assert_close(edit.fused(_sdpa, q, k, v, mask), expected @ v, rtol=0, atol=1e-12)


def test_a_scale_alone_multiplies_a_keys_weight_and_leaves_the_others():
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, 2, n, 4, generator=g, dtype=torch.float64) for n in (9, 5, 5))
    scale = torch.ones(2, 5, dtype=torch.float64)
    scale[0, 2] = 1.5
    weights = attention_weights(attention_scores(q, k))
    edited = AttentionEdit(scale=scale).apply(weights)
    torch.testing.assert_close(edited[..., [0, 1, 3, 4]], weights[..., [0, 1, 3, 4]], rtol=0, atol=0)
    torch.testing.assert_close(edited[0, ..., 2], 1.5 * weights[0, ..., 2], rtol=0, atol=1e-15)
    torch.testing.assert_close(edited[1], weights[1], rtol=0, atol=0)
    # a row then sums to 1 + (w - 1)·a: no renormalisation (prompt-to-prompt's reweight)
    torch.testing.assert_close(edited[0].sum(-1), 1 + 0.5 * weights[0, ..., 2], rtol=0, atol=1e-14)
    torch.testing.assert_close(AttentionEdit(scale=scale).fused(_sdpa, q, k, v, None), edited @ v, rtol=0, atol=1e-13)


def test_a_source_without_a_key_map_takes_every_key_its_own_place():
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(3, 2, 10, 4, generator=g, dtype=torch.float64) for _ in range(3))
    edit = AttentionEdit(source=torch.tensor([-1, 0, 0]))
    weights = attention_weights(attention_scores(q, k))
    edited = edit.apply(weights)
    assert torch.equal(edited[1], weights[0]) and torch.equal(edited[2], weights[0]) and torch.equal(edited[0], weights[0])
    torch.testing.assert_close(edit.fused(_sdpa, q, k, v, None), edited @ v, rtol=0, atol=1e-13)
    with pytest.raises(ValueError, match="key map needs the source rows"):
        AttentionEdit(key_map=torch.zeros(3, 10, dtype=torch.long))


def _layers(dtype):
    torch.manual_seed(0)
    return (MultiHeadSelfAttention(12, num_heads=3).to(dtype), MultiHeadCrossAttention(12, 6, num_heads=2).to(dtype))


@pytest.mark.parametrize("dtype, atol", [(torch.float64, 1e-12), (torch.float32, 2e-5)])
def test_the_fused_and_readable_paths_of_an_edited_layer_agree(dtype, atol):
    sa, ca = _layers(dtype)
    g = torch.Generator().manual_seed(3)
    x = torch.randn(4, 20, 12, generator=g, dtype=dtype)
    context = torch.randn(4, 5, 6, generator=g, dtype=dtype)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [0, 0, 0, 0, 0], [1, 1, 0, 0, 0]], dtype=torch.bool)
    self_edit = AttentionEdit(source=torch.tensor([-1, 0, 0, 1]))
    cross_edit = _random_edit(4, 5, g, dtype)
    outs = {}
    for fused in (True, False):
        sa.fused_attn = ca.fused_attn = fused
        with edit_attention(sa, self_edit=self_edit), edit_attention(ca, cross_edit=cross_edit):
            outs[fused] = (sa(x), ca(x, context, mask))
    for a, b in zip(outs[True], outs[False]):
        torch.testing.assert_close(a, b, rtol=0, atol=atol)
    assert outs[True][1][2].abs().max() == 0  # an empty prompt's row still adds nothing
    plain = ca(x, context, mask)
    assert (plain - outs[False][1]).abs().max() > 1e-3  # the edit changed something


def test_no_edit_is_bit_identical_and_edits_stay_in_their_context():
    sa, ca = _layers(torch.float32)
    x = torch.randn(2, 9, 12)
    before = sa(x)
    with edit_attention(sa, self_edit=None, cross_edit=None):
        assert torch.equal(sa(x), before)
    with edit_attention(sa, self_edit=AttentionEdit(scale=torch.full((2, 9), 2.0))):
        assert not torch.equal(sa(x), before)
    assert torch.equal(sa(x), before)


def test_captured_weights_are_the_edited_weights_that_ran():
    _, ca = _layers(torch.float64)
    g = torch.Generator().manual_seed(4)
    x = torch.randn(3, 16, 12, generator=g, dtype=torch.float64)
    context = torch.randn(3, 4, 6, generator=g, dtype=torch.float64)
    mask = torch.ones(3, 4, dtype=torch.bool)
    edit = AttentionEdit(scale=torch.tensor([[1.0, 2.0, 1.0, 1.0]] * 3, dtype=torch.float64),
                         source=torch.tensor([-1, 0, 0]), key_map=torch.tensor([[-1] * 4, [0, 1, 2, 3], [0, -1, 3, 3]]))
    with capture_attention(ca) as records, edit_attention(ca, cross_edit=edit):
        out = ca(x, context, mask, spatial_size=(4, 4))
    (rec,) = records
    full = torch.stack([rec.token_map(j) for j in range(4)], dim=-1).flatten(2, 3)  # (B, h, N, L)
    # the output is the recorded weights times the values, projected: what ran is what the capture shows
    v = ca.kv(context).reshape(3, 4, 2, 2, 6).permute(2, 0, 3, 1, 4)[1]  # (B, h, L, d)
    rebuilt = ca.proj((full @ v).transpose(1, 2).reshape(3, 16, 12))
    torch.testing.assert_close(rebuilt, out, rtol=0, atol=1e-12)
    assert torch.equal(rec.weights((1, 2))[1], rec.weights((1, 2))[0])  # row 1 took row 0's maps, word for word


def test_identity_weights_and_an_edit_on_one_layer_are_refused():
    sa, _ = _layers(torch.float32)
    container = torch.nn.ModuleDict({"attn": sa})
    with identity_attention(container), edit_attention(container, self_edit=AttentionEdit(source=torch.tensor([-1, 0]))):
        with pytest.raises(ValueError, match="set PAG to 0"):
            sa(torch.randn(2, 4, 12))


def test_the_first_rows_of_an_edit_are_cut_apart_only_when_their_sources_are_among_them():
    edit = AttentionEdit(scale=torch.ones(4, 3), source=torch.tensor([-1, 0, -1, 2]), key_map=torch.zeros(4, 3, dtype=torch.long))
    first = edit.first_rows(2)
    assert first.source.tolist() == [-1, 0] and first.scale.shape == (2, 3) and first.key_map.shape == (2, 3)
    with pytest.raises(ValueError, match="cannot be cut apart"):
        AttentionEdit(source=torch.tensor([-1, 3, -1, -1])).first_rows(2)

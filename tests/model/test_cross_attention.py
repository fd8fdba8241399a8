"""Cross-attention: the module against per-head torch SDPA in float64 with padding, capture of word maps,
and the UNet with `cross_attention_dim` (diffusers' encoder_hidden_states / encoder_attention_mask)."""

from __future__ import annotations

import copy
import json

import pytest
import torch
import torch.nn.functional as F
from safetensors import safe_open

from denoiser import UNet
from denoiser.folders.model_dir import WEIGHTS_DIR
from denoiser.model.attention import MultiHeadCrossAttention, attention_layer_names, scaled_dot_product_attention
from denoiser.model.attention_blocks import SpatialCrossAttention, identity_attention, to_tokens
from denoiser.model.attention_capture import capture_attention
from tests.conftest import TINY

CROSS = dict(TINY, cross_attention_dim=12)


def _keep(B: int, L: int) -> torch.Tensor:
    """(B, L) bool, True = a token: row 0 all tokens, row 1 padding at the end and one inside, the last row
    nothing but padding (an empty prompt)."""
    keep = torch.ones(B, L, dtype=torch.bool)
    keep[1, L // 2 :] = False
    keep[1, 0] = L == 1  # a padding token before real ones (none left when L = 1)
    keep[-1] = False
    return keep


def _randomize(module: torch.nn.Module, seed: int = 0) -> None:
    """Random weights everywhere, the zero-initialised output projections included (or they hide everything)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype) * 0.3)


def _by_hand(attn: MultiHeadCrossAttention, x, context, keep) -> torch.Tensor:
    """Cross-attention head by head: torch SDPA on each head's slices of the projections, heads concatenated
    and projected; a row keeping no token (empty prompt) outputs zero."""
    C, d = attn.dim, attn.head_dim
    heads = []
    for i in range(attn.num_heads):
        rows = slice(i * d, (i + 1) * d)
        q = F.linear(x, attn.q.weight[rows], attn.q.bias[rows])  # (B, N, d)
        k = F.linear(context, attn.kv.weight[rows], attn.kv.bias[rows])  # (B, L, d)
        v = F.linear(context, attn.kv.weight[C:][rows], attn.kv.bias[C:][rows])  # (B, L, d)
        mask = None if keep is None else keep[:, None, :]  # (B, 1, L): the same tokens for every pixel
        heads.append(F.scaled_dot_product_attention(q, k, v, attn_mask=mask))
    out = attn.proj(torch.cat(heads, dim=-1))  # (B, N, C)
    return out if keep is None else out.masked_fill(~keep.any(-1)[:, None, None], 0.0)


CASES = [  # (channels, num_heads, head_dim, context_dim, N, L): awkward sizes, L < N, L = 1, L > N
    (24, 3, None, 10, 35, 9),
    (24, None, 12, 13, 35, 16),
    (16, 1, None, 7, 6, 1),
    (32, 4, None, 5, 3, 11),
]


@pytest.mark.parametrize("C,heads,head_dim,D,N,L", CASES)
@pytest.mark.parametrize("masked", [False, True])
def test_readable_and_fused_equal_per_head_sdpa_in_float64(C, heads, head_dim, D, N, L, masked):
    torch.manual_seed(C + N + L)
    attn = MultiHeadCrossAttention(C, D, num_heads=heads, head_dim=head_dim).double()
    x, context = torch.randn(3, N, C, dtype=torch.float64), torch.randn(3, L, D, dtype=torch.float64)
    keep = _keep(3, L) if masked else None
    reference = _by_hand(attn, x, context, keep)
    for fused in (True, False):
        attn.fused_attn = fused
        torch.testing.assert_close(attn(x, context, keep), reference, rtol=1e-10, atol=1e-10)
    if masked:
        assert (reference[-1] == 0).all()  # the empty prompt


@pytest.mark.parametrize("C,heads,head_dim,D,N,L", CASES)
def test_float32_paths_are_as_accurate_as_torch(C, heads, head_dim, D, N, L):
    torch.manual_seed(1)
    attn = MultiHeadCrossAttention(C, D, num_heads=heads, head_dim=head_dim)
    x, context, keep = torch.randn(3, N, C), torch.randn(3, L, D), _keep(3, L)
    exact = _by_hand(copy.deepcopy(attn).double(), x.double(), context.double(), keep)
    torch_err = (_by_hand(attn, x, context, keep).double() - exact).abs().max().item()
    outs = []
    for fused in (True, False):
        attn.fused_attn = fused
        outs.append(attn(x, context, keep))
        assert (outs[-1].double() - exact).abs().max().item() <= 2 * torch_err + 1e-6
    torch.testing.assert_close(outs[0], outs[1], rtol=1e-5, atol=1e-6)


def test_padding_is_as_if_the_token_were_not_there():
    torch.manual_seed(0)
    attn = MultiHeadCrossAttention(16, 6, num_heads=2).double()
    x, context = torch.randn(2, 20, 16, dtype=torch.float64), torch.randn(2, 7, 6, dtype=torch.float64)
    keep = torch.tensor([[1, 1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 0, 0, 0]], dtype=torch.bool)
    scrambled = context.clone()
    scrambled[:, 4:] = 1e3 * torch.randn(2, 3, 6, dtype=torch.float64)  # whatever sits in the padding
    for fused in (True, False):
        attn.fused_attn = fused
        short = attn(x, context[:, :4])  # the prompt without its padding
        torch.testing.assert_close(attn(x, context, keep), short, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(attn(x, scrambled, keep), short, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("fused", [True, False])
def test_empty_prompt_adds_nothing_and_has_finite_gradients(fused):
    torch.manual_seed(0)
    block = SpatialCrossAttention(16, 8, num_heads=2, norm_num_groups=4, fused_attn=fused)
    _randomize(block)
    x = torch.randn(3, 16, 4, 5, requires_grad=True)
    context = torch.randn(3, 6, 8, requires_grad=True)
    keep = _keep(3, 6)
    out = block(x, context, keep)
    assert torch.isfinite(out).all()
    assert torch.equal(out[-1], x[-1])  # nothing but padding: the block passes its input through
    assert not torch.allclose(out[0], x[0])
    out.square().sum().backward()
    grads = [x.grad, context.grad, *(p.grad for p in block.parameters())]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
    assert (context.grad[-1] == 0).all() and (context.grad[1][~keep[1]] == 0).all()  # padding gets no gradient


def test_capture_rebuilds_pixel_weights_and_token_maps_exactly():
    torch.manual_seed(0)
    block = SpatialCrossAttention(16, 8, num_heads=2, norm_num_groups=4).double()
    _randomize(block)
    x, context, keep = torch.randn(3, 16, 5, 7, dtype=torch.float64), torch.randn(3, 6, 8, dtype=torch.float64), _keep(3, 6)
    plain = block(x, context, keep)
    with capture_attention(block) as records:
        captured = block(x, context, keep)
    assert torch.equal(plain, captured)  # bit-identical
    (rec,) = records
    assert rec.kind == "cross" and rec.size == (5, 7) and rec.num_heads == 2
    assert rec.q.shape == (3, 2, 35, 8) and rec.k.shape == (3, 2, 6, 8)  # O(N·d + L·d): no N×L matrix kept
    assert torch.equal(rec.key_mask, keep)
    # the weights the layer computed, by the reference: (B, h, N, L)
    attn = block.attention
    q = attn.q(to_tokens(block.norm(x))).reshape(3, 35, 2, 8).transpose(1, 2)
    k, v = attn.kv(context).reshape(3, 6, 2, 2, 8).permute(2, 0, 3, 1, 4)
    _, ref_w = scaled_dot_product_attention(q, k, v, attn_mask=keep[:, None, None, :], return_weights=True)
    for y, xq in [(0, 0), (2, 3), (4, 6)]:  # click a pixel: its weights over the prompt's tokens
        w = rec.weights((y, xq))
        assert w.shape == (3, 2, 6)
        torch.testing.assert_close(w, ref_w[:, :, y * 7 + xq], rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(w[:2].sum(-1), torch.ones(2, 2, dtype=torch.float64))
    for j in range(6):  # click a word: its map over the pixels
        m = rec.token_map(j)
        assert m.shape == (3, 2, 5, 7)
        torch.testing.assert_close(m.flatten(2), ref_w[:, :, :, j], rtol=1e-12, atol=1e-12)
        assert (m[~keep[:, j]] == 0).all()  # a padding token's map is zero
    assert (rec.weights((1, 1))[-1] == 0).all() and torch.isfinite(rec.scores((1, 1))[0]).all()
    with pytest.raises(ValueError, match="outside 0..5"):
        rec.token_map(6)


def test_self_attention_token_map_is_a_column_of_the_weights(tiny_unet):
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad(), capture_attention(tiny_unet) as records:
        tiny_unet(x, 50)
    rec = records[0]
    H, W = rec.size
    columns = torch.stack([rec.weights(n).flatten(2)[..., 9] for n in range(H * W)], dim=-1)  # (B, h, N)
    torch.testing.assert_close(rec.token_map(9).flatten(2), columns, rtol=1e-6, atol=1e-7)


# --- the UNet with cross-attention --------------------------------------------------------------------------


def _prompt(B: int = 3, L: int = 5, D: int = 12, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(B, L, D, generator=g), _keep(B, L).long()  # diffusers' mask: 1 = token, 0 = padding


@pytest.fixture
def cross_unet():
    torch.manual_seed(0)
    unet = UNet(**CROSS).eval()
    _randomize(unet)
    return unet


def test_cross_blocks_follow_every_self_attention_block(cross_unet):
    selfs, crosses = attention_layer_names(cross_unet), attention_layer_names(cross_unet, "cross")
    assert selfs == ["down.1.attn.0", "mid_attn", "up.0.attn.0", "up.0.attn.1"]
    assert crosses == ["down.1.cross.0", "mid_cross", "up.0.cross.0", "up.0.cross.1"]
    x = torch.randn(3, 3, 16, 16)
    states, mask = _prompt()
    with torch.no_grad(), capture_attention(cross_unet) as records:
        cross_unet(x, 10, encoder_hidden_states=states, encoder_attention_mask=mask)
    assert [r.name for r in records] == [n for pair in zip(selfs, crosses) for n in pair]  # each right after its own
    assert [r.kind for r in records] == ["self", "cross"] * 4
    with pytest.raises(ValueError, match="identity weights need"):
        with identity_attention(cross_unet, ["mid_cross"]):
            pass


def test_prompt_changes_the_output_and_no_prompt_is_the_unconditional_model(cross_unet):
    x = torch.randn(3, 3, 16, 16)
    states, mask = _prompt()
    with torch.no_grad():
        none = cross_unet(x, 10).sample
        prompted = cross_unet(x, 10, encoder_hidden_states=states, encoder_attention_mask=mask).sample
        all_padding = cross_unet(x, 10, encoder_hidden_states=states, encoder_attention_mask=torch.zeros_like(mask)).sample
        no_tokens = cross_unet(x, 10, encoder_hidden_states=states[:, :0], encoder_attention_mask=mask[:, :0]).sample
    assert torch.isfinite(prompted).all()
    assert not torch.allclose(prompted[0], none[0]) and not torch.allclose(prompted[1], none[1])
    torch.testing.assert_close(prompted[2], none[2], rtol=1e-6, atol=1e-6)  # row 2 is an empty prompt
    assert torch.equal(all_padding, none) and torch.equal(no_tokens, none)


def test_mask_forms_agree_and_bad_inputs_are_explained(cross_unet):
    x = torch.randn(3, 3, 16, 16)
    states, mask = _prompt()
    with torch.no_grad():
        outs = [cross_unet(x, 10, encoder_hidden_states=states, encoder_attention_mask=m).sample
                for m in (mask, mask.bool(), mask.float())]
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2])
    with pytest.raises(ValueError, match="1 for a token and 0 for padding"):
        cross_unet(x, 10, encoder_hidden_states=states, encoder_attention_mask=2 * mask)
    with pytest.raises(ValueError, match=r"must have shape \(3, L, 12\)"):
        cross_unet(x, 10, encoder_hidden_states=states[..., :8])
    with pytest.raises(ValueError, match=r"encoder_attention_mask must have shape \(3, 5\)"):
        cross_unet(x, 10, encoder_hidden_states=states, encoder_attention_mask=mask[:, :4])
    with pytest.raises(ValueError, match="without encoder_hidden_states"):
        cross_unet(x, 10, encoder_attention_mask=mask)
    with pytest.raises(ValueError, match="cross_attention_dim is None"):
        UNet(**TINY)(x, 10, encoder_hidden_states=states)


def test_new_blocks_start_as_the_model_they_extend(tiny_unet):
    # zero output projections: today's weights in a model with cross-attention compute today's function
    cross = UNet(**CROSS).eval()
    missing, unexpected = cross.load_state_dict(tiny_unet.state_dict(), strict=False)
    assert not unexpected and missing and all(".cross." in k or k.startswith("mid_cross.") for k in missing)
    x = torch.randn(2, 3, 16, 16)
    states, mask = _prompt(2)
    with torch.no_grad():
        assert torch.equal(cross(x, 10, encoder_hidden_states=states, encoder_attention_mask=mask).sample,
                           tiny_unet(x, 10).sample)


def test_models_without_cross_attention_build_and_call_none(monkeypatch):
    torch.manual_seed(0)
    unet = UNet(**TINY).eval()
    assert unet.config.cross_attention_dim is None
    assert not any(isinstance(m, (SpatialCrossAttention, MultiHeadCrossAttention)) for m in unet.modules())
    assert not any("cross" in k for k in unet.state_dict())
    assert attention_layer_names(unet, "cross") == []

    def never(*args, **kwargs):
        raise AssertionError("a model without cross_attention_dim called a cross-attention block")

    monkeypatch.setattr(SpatialCrossAttention, "forward", never)
    monkeypatch.setattr(MultiHeadCrossAttention, "forward", never)
    with torch.no_grad():
        assert torch.isfinite(unet(torch.randn(1, 3, 16, 16), 5).sample).all()


@pytest.mark.parametrize("name", ["cifar10", "synthetic-shapes"])
def test_shipped_weights_match_the_plain_model_key_for_key(name):
    folder = WEIGHTS_DIR / name / "unet"
    config = {k: v for k, v in json.loads((folder / "config.json").read_text()).items() if not k.startswith("_")}
    assert config.get("cross_attention_dim") is None  # a class model: absent (saved before cross-attention) or null
    with torch.device("meta"):
        unet = UNet(**config)
    with safe_open(folder / "diffusion_pytorch_model.safetensors", "pt") as f:
        saved = set(f.keys())
    assert set(unet.state_dict()) == saved  # no missing, no unexpected keys


def test_speed_layer_on_and_off_and_save_load(cross_unet, tmp_path, monkeypatch):
    from denoiser.fast import kernels

    x = torch.randn(3, 3, 16, 16)
    states, mask = _prompt()
    kwargs = {"encoder_hidden_states": states, "encoder_attention_mask": mask}
    cross_unet.save_pretrained(tmp_path / "unet")
    assert json.loads((tmp_path / "unet" / "config.json").read_text())["cross_attention_dim"] == 12
    loaded = UNet.from_pretrained(tmp_path / "unet").eval()
    with torch.inference_mode():
        reference = cross_unet(x, 10, **kwargs).sample  # NCHW: torch's GroupNorm and SDPA
        assert torch.equal(loaded(x, 10, **kwargs).sample, reference)
        loaded = loaded.to(memory_format=torch.channels_last)
        x_cl = x.contiguous(memory_format=torch.channels_last)
        fast = loaded(x_cl, 10, **kwargs).sample  # channels-last: the speed layer's kernels
        monkeypatch.setattr(kernels, "_state", {"ok": False, "error": "switched off"})
        slow = loaded(x_cl, 10, **kwargs).sample
    torch.testing.assert_close(fast, reference, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(slow, reference, rtol=1e-4, atol=1e-5)


def test_gradient_checkpointing_covers_the_cross_blocks(cross_unet):
    plain = cross_unet.train()
    ckpt = copy.deepcopy(plain)
    ckpt.enable_gradient_checkpointing()
    x = torch.randn(2, 3, 16, 16)
    states, mask = _prompt(2)
    kwargs = {"encoder_hidden_states": states, "encoder_attention_mask": mask}
    grads = []
    for model in (plain, ckpt):
        model(x, torch.tensor([5, 700]), **kwargs).sample.square().mean().backward()
        grads.append([p.grad for p in model.parameters()])
    assert all(g1 is not None and torch.equal(g1, g2) for g1, g2 in zip(*grads))
    assert all(g.abs().sum() > 0 for g, (n, _) in zip(grads[0], plain.named_parameters()) if "cross" in n)
    calls = []
    ckpt._gradient_checkpointing_func = lambda module, *args: calls.append(type(module).__name__) or module(*args)
    ckpt(x, 5, **kwargs)
    assert calls.count("SpatialCrossAttention") == 4


def test_export_with_a_prompt(cross_unet):
    x = torch.randn(3, 3, 16, 16)
    states, mask = _prompt()
    kwargs = {"encoder_hidden_states": states, "encoder_attention_mask": mask}
    exported = torch.export.export(cross_unet, (x, torch.tensor(10)), kwargs)
    with torch.no_grad():
        torch.testing.assert_close(exported.module()(x, torch.tensor(10), **kwargs).sample,
                                   cross_unet(x, torch.tensor(10), **kwargs).sample, rtol=1e-5, atol=1e-5)
    assert "aten.any.default" not in str(exported.graph)  # the eager-only mask check is not traced

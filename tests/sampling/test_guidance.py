"""Guidance: the identity switch, PAG and autoguidance against hand-written references on tiny models."""

from __future__ import annotations

import copy

import pytest
import torch
from diffusers import DDIMScheduler, DDPMScheduler

from denoiser import UNet
from denoiser.model.attention import attention_layer_names
from denoiser.model.attention_blocks import SpatialSelfAttention, identity_attention, to_tokens
from denoiser.sampling.guidance import Guidance, check_guide
from denoiser.sampling.loop import sample, sampling_context
from tests.conftest import TINY, seeded_noise, unet_calls


def test_identity_attention_output_is_the_value_path_by_hand():
    torch.manual_seed(0)
    block = SpatialSelfAttention(16, num_heads=2, norm_num_groups=4).eval()
    x = torch.randn(3, 16, 5, 7, dtype=torch.float64)
    block = block.double()
    # by hand: each pixel attends only to itself, so stage (4) returns v: out = x + proj(v)
    tokens = to_tokens(block.norm(x))  # (B, N, C)
    v = tokens @ block.attention.qkv.weight[32:].T + block.attention.qkv.bias[32:]  # (B, N, C): the value rows
    want = x + (v @ block.attention.proj.weight.T + block.attention.proj.bias).transpose(1, 2).reshape(x.shape)
    with torch.no_grad(), identity_attention(block):
        got = block(x)
    with torch.no_grad():
        plain = block(x)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)
    assert (got - plain).abs().max() > 1e-3  # the switch changes the output


def test_identity_switch_by_head_and_batch_rows():
    torch.manual_seed(0)
    block = SpatialSelfAttention(16, num_heads=2, norm_num_groups=4).eval()
    x = torch.randn(4, 16, 4, 4)
    with torch.no_grad():
        plain = block(x)
        with identity_attention(block, batch_start=2):
            half = block(x)
        with identity_attention(block):
            full = block(x)
        with identity_attention(block, heads=[1]):
            head1 = block(x)
    assert torch.equal(half[:2], plain[:2])  # rows before batch_start attend as usual
    torch.testing.assert_close(half[2:], full[2:], rtol=1e-6, atol=1e-6)
    assert (head1 - plain).abs().max() > 1e-4 and (head1 - full).abs().max() > 1e-4  # one head: between both
    with pytest.raises(ValueError, match="heads must lie in 0..1"):
        with identity_attention(block, heads=[2]):
            pass


def test_identity_switch_changes_only_the_chosen_layer(class_unet):
    names = attention_layer_names(class_unet)
    assert names == ["down.1.attn.0", "mid_attn", "up.0.attn.0", "up.0.attn.1"]
    seen = {}
    hooks = [m.register_forward_hook(lambda m, i, o, n=n: seen.__setitem__(n, (i[0].clone(), o.clone())))
             for n, m in class_unet.named_modules() if isinstance(m, SpatialSelfAttention)]
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        class_unet(x, 10)
        before = dict(seen)
        with identity_attention(class_unet, ["mid_attn"]):
            class_unet(x, 10)
    for h in hooks:
        h.remove()
    # layers before the switched one see the same input and give the same output; the switched one differs
    for name in ("down.1.attn.0",):
        assert torch.equal(before[name][1], seen[name][1])
    assert torch.equal(before["mid_attn"][0], seen["mid_attn"][0])
    assert (before["mid_attn"][1] - seen["mid_attn"][1]).abs().max() > 1e-4
    with pytest.raises(ValueError, match="unknown attention layer"):
        with identity_attention(class_unet, ["mid"]):
            pass


def test_pag_scale_0_and_guide_weight_1_give_exactly_the_plain_images(class_unet, guide_unet):
    labels = torch.tensor([0, 2])
    plain = sample(class_unet, DDIMScheduler(num_train_timesteps=1000), 2, 3, seed=1, class_labels=labels).images
    for g in (Guidance(pag_scale=0.0), Guidance(guide=guide_unet, guide_scale=1.0)):
        got = sample(class_unet, DDIMScheduler(num_train_timesteps=1000), 2, 3, seed=1, class_labels=labels, guidance=g).images
        assert torch.equal(got, plain)


# `sample` makes one batched UNet call per step, the loop by hand one call per term: the convolutions round differently
# by batch (a few 1e-6 of ε, denoiser.fast.winograd), and guidance scales that up
BATCHED = dict(rtol=0, atol=1e-4)

def _by_hand(unet, guide, labels, w, s, a, layers, steps=3, seed=1, interval=(0, 999)):
    """The guided DDIM loop with one UNet call per term: out = ε_u + w(ε_c − ε_u) + s(ε_c − ε_p) + (a − 1)(ε_c − ε_g)
    at the timesteps inside `interval`, ε_c at the others."""
    sched = DDIMScheduler(num_train_timesteps=1000)
    sched.set_timesteps(steps)
    x = seeded_noise((len(labels), 3, 16, 16), seed)
    with torch.no_grad(), sampling_context(unet), sampling_context(guide):  # the convolutions `sample` runs
        for t in sched.timesteps:
            cond = unet(x, t, class_labels=labels).sample
            if not interval[0] <= int(t) <= interval[1]:
                x = sched.step(cond, t, x).prev_sample
                continue
            uncond = unet(x, t, class_labels=torch.full_like(labels, 3)).sample
            with identity_attention(unet, layers):
                perturbed = unet(x, t, class_labels=labels).sample
            guided = guide(x, t, class_labels=labels).sample
            out = uncond + w * (cond - uncond) + s * (cond - perturbed) + (a - 1) * (cond - guided)
            x = sched.step(out, t, x).prev_sample
    return (x / 2 + 0.5).clamp(0, 1)


@pytest.mark.parametrize("w,s,a", [(1.0, 2.0, 1.0), (2.5, 1.5, 1.0), (1.0, 0.0, 2.0), (2.0, 1.0, 1.5)])
def test_guidance_formulas_match_a_hand_written_loop(class_unet, guide_unet, w, s, a):
    labels = torch.tensor([0, 2])
    layers = ("mid_attn", "up.0.attn.1")
    g = Guidance(scale=w, pag_scale=s, pag_layers=layers, guide=guide_unet, guide_scale=a)
    got = sample(class_unet, DDIMScheduler(num_train_timesteps=1000), 2, 3, seed=1, class_labels=labels, guidance=g).images
    want = _by_hand(class_unet, guide_unet, labels, w, s, a, layers)
    torch.testing.assert_close(got, want, **BATCHED)
    plain = sample(class_unet, DDIMScheduler(num_train_timesteps=1000), 2, 3, seed=1, class_labels=labels).images
    assert (plain - got).abs().max() > 1e-3


def test_a_batch_over_rows_per_call_runs_as_calls_of_whole_images_with_the_same_images(class_unet, monkeypatch):
    """On a CPU, many images with guidance (64 with CFG: 128 rows) ran 1.2-1.3x slower per row than calls of 32 rows
    (bench/sample_batch.md): main_pass splits them into calls of whole images, each with all its terms' rows."""
    from denoiser.model.attention_capture import capture_attention
    from denoiser.sampling import guidance

    unet = copy.deepcopy(class_unet).double()  # float64: the calls' rounding far below the tolerance
    labels = torch.tensor([0, 2, 1, 0, 2])
    g = Guidance(scale=2.5, pag_scale=1.5, pag_layers=("mid_attn",), interval=(0, 400))  # t 750 500 250 0

    def images() -> torch.Tensor:
        return sample(unet, DDIMScheduler(num_train_timesteps=1000), 5, 4, seed=1, class_labels=labels, guidance=g).images

    with unet_calls(unet) as rows:
        whole = images()
        assert rows == [5] * 2 + [15] * 2  # 2 steps outside the interval (ε_c alone), 2 inside: 3 terms x 5 images
        rows.clear()
        monkeypatch.setattr(guidance, "ROWS_PER_CALL", 6)
        split = images()
        assert rows == [5] * 2 + [6, 6, 3] * 2  # outside: 5 rows fit; inside: 2 images (6 rows) a call
        torch.testing.assert_close(split, whole, rtol=0, atol=1e-12)
        assert (split - sample(unet, DDIMScheduler(num_train_timesteps=1000), 5, 4, seed=1, class_labels=labels).images
                ).abs().max() > 1e-3  # the guidance acted
        rows.clear()
        with torch.no_grad(), capture_attention(unet) as records:  # captured: one call, the records the batch's
            g.main_pass(unet, torch.randn(5, 3, 16, 16, dtype=torch.float64), torch.tensor(250), labels)
        assert rows == [15] and {r.q.shape[0] for r in records} == {15}


def test_guidance_interval_guides_only_the_steps_inside_it(class_unet, guide_unet):
    labels = torch.tensor([0, 2])
    layers = ("mid_attn",)
    run = lambda interval: sample(  # noqa: E731
        class_unet, DDIMScheduler(num_train_timesteps=1000), 2, 4, seed=1, class_labels=labels,
        guidance=Guidance(2.0, 1.0, layers, guide_unet, 1.5, interval=interval)).images
    got = run((200, 600))  # DDIM-4 visits 750, 500, 250, 0: guided at 500 and 250 only
    want = _by_hand(class_unet, guide_unet, labels, 2.0, 1.0, 1.5, layers, steps=4, interval=(200, 600))
    torch.testing.assert_close(got, want, **BATCHED)
    everywhere = sample(class_unet, DDIMScheduler(num_train_timesteps=1000), 2, 4, seed=1, class_labels=labels,
                        guidance=Guidance(2.0, 1.0, layers, guide_unet, 1.5)).images
    plain = sample(class_unet, DDIMScheduler(num_train_timesteps=1000), 2, 4, seed=1, class_labels=labels).images
    assert torch.equal(run((0, 999)), everywhere) and torch.equal(run((800, 900)), plain)  # ends included, none inside
    assert (got - everywhere).abs().max() > 1e-3 and (got - plain).abs().max() > 1e-3
    assert Guidance(2.0, interval=[200, 600]).describe() == "CFG 2, at t in [200, 600]"
    # passes per step: 2 of 4 steps guided with CFG + PAG (2 extra rows) + the guide (cost 0.5): 1 + 0.5 * 2.5
    g = Guidance(2.0, 1.0, layers, guide_unet, 1.5, interval=(200, 600))
    assert g.passes_per_step([750, 500, 250, 0], guide_cost=0.5) == 2.25
    assert g.passes_per_step(None, guide_cost=0.5) == 3.5 and Guidance().passes_per_step([750, 0]) == 1.0


def test_pag_needs_no_class_and_defaults_to_the_first_up_level(class_unet):
    g = Guidance(pag_scale=2.0)
    assert g.layers_for(class_unet) == ("up.0.attn.0", "up.0.attn.1") and g.main_passes == 2
    no_up = UNet(**{**TINY, "attention_resolutions": ()}, num_class_embeds=3)
    assert g.layers_for(no_up) == ("mid_attn",)
    images = sample(class_unet, DDIMScheduler(num_train_timesteps=1000), 2, 2, seed=0, guidance=g).images
    assert images.shape == (2, 3, 16, 16)


@pytest.mark.parametrize("kwargs,match", [
    (dict(scale=0.5), "must be >= 1"),
    (dict(pag_scale=-1.0), "PAG scale must be >= 0"),
    (dict(guide_scale=2.0), "needs a guide model"),
    (dict(scale=float("nan")), "finite number"),
    (dict(interval=(600, 200)), "0 <= lo <= hi"),
    (dict(interval=(-5, 200)), "0 <= lo <= hi"),
    (dict(interval=(0, float("nan"))), "0 <= lo <= hi"),
    (dict(interval=(100,)), "two timesteps"),
    (dict(interval="late"), "two timesteps"),
])
def test_bad_guidance_is_refused_with_the_fix(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Guidance(**kwargs)


def test_bad_layers_and_cfg_without_class_fail_before_sampling(class_unet):
    sched = DDIMScheduler(num_train_timesteps=1000)
    with pytest.raises(ValueError, match="unknown PAG layer"):
        sample(class_unet, sched, 1, 2, guidance=Guidance(pag_scale=1.0, pag_layers=("nope",)))
    with pytest.raises(ValueError, match="needs a class-conditional model and a class label"):
        sample(class_unet, sched, 1, 2, guidance=Guidance(scale=2.0))


def test_guide_of_another_task_is_refused(class_unet):
    other = UNet(**TINY, num_class_embeds=4)
    sched = DDPMScheduler(num_train_timesteps=1000)
    with pytest.raises(ValueError, match="num_class_embeds = 4"):
        check_guide(class_unet, sched.config, other, sched.config)
    v_sched = DDPMScheduler(num_train_timesteps=1000, prediction_type="v_prediction")
    with pytest.raises(ValueError, match="prediction_type"):
        check_guide(class_unet, sched.config, UNet(**TINY, num_class_embeds=3), v_sched.config)

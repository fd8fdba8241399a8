"""Prompt-to-prompt and weighted prompts through sampling (denoiser/sampling/prompt_to_prompt.py, denoiser.sampling.plan, the pipeline and
the CLI): the community pipeline's arguments, the word maps, the step counts, and the references: a weight of 1 is
the plain prompt exactly, both fractions at 0 are a plain generation of the target from the same noise, fractions at 1
give the target exactly the source's captured maps."""

from __future__ import annotations

import pytest
import torch
from diffusers import DDIMScheduler, DDPMScheduler

from denoiser.folders.model_dir import LoadedModel, TextModel
from denoiser.model.attention import MultiHeadAttention
from denoiser.model.text import HashTextEncoder
from denoiser.model.unet import UNet
from denoiser.request import GuidanceRequest, PromptEdit, SampleRequest
from denoiser.sampling.pipeline import DenoiserPipeline, save_pipeline
from denoiser.sampling.plan import resolve, run
from denoiser.sampling.prompt_to_prompt import edit_plan, word_map
from tests.conftest import TINY
from tests.model.test_text import TEXT, D, _tokenizer, _wake_cross, one_thread  # noqa: F401  (one_thread: autouse)

BASE = dict(seed=5, steps=4, guidance=GuidanceRequest(guidance_scale=2.0))


@pytest.fixture
def text_model():
    """(UNet with live cross-attention, tokenizer, text encoder): tests/model/test_text.py's tiny text model."""
    torch.manual_seed(0)
    return _wake_cross(UNet(**TINY, cross_attention_dim=D).eval()), _tokenizer(), HashTextEncoder(**TEXT).eval()


def _images(model, **fields) -> torch.Tensor:
    unet, tok, enc = model
    plan = resolve(SampleRequest(**{**BASE, **fields}), LoadedModel.of(unet, DDIMScheduler(), TextModel(tok, enc)))
    return run(plan).images


def _edit(**kw) -> PromptEdit:
    return PromptEdit(**kw)


# ------------------------------------------------------------------------------------------------------------------
# the arguments
# ------------------------------------------------------------------------------------------------------------------


def test_the_community_pipelines_arguments_in_either_spelling():
    readme = PromptEdit.from_kwargs({"edit_type": "replace", "cross_replace_steps": 0.8, "self_replace_steps": 0.4})
    code = PromptEdit.from_kwargs({"edit_type": "replace", "n_cross_replace": 0.8, "n_self_replace": 0.4})
    assert readme == code == PromptEdit("replace", 0.8, 0.4)
    assert readme.cross_replace_steps == (0.0, 0.8) and readme.self_replace_steps == (0.0, 0.4)
    pair = PromptEdit.from_kwargs({"edit_type": "refine", "n_self_replace": [0.2, 0.6]})
    assert pair.self_replace_steps == (0.2, 0.6)
    weighted = PromptEdit.from_kwargs({"edit_type": "reweight", "equalizer_words": "red", "equalizer_strengths": 3})
    assert weighted.equalizer_words == ("red",) and weighted.equalizer_strengths == (3.0,)


@pytest.mark.parametrize("kwargs, message", [
    ({"edit_type": "replace", "cross_replace_step": 0.8}, r"unknown key\(s\) 'cross_replace_step'; known: "),
    ({"edit_type": "replace", "n_cross_replace": 0.8, "cross_replace_steps": 0.5}, "they are one setting, give one"),
    ({"cross_replace_steps": 0.8}, 'needs "edit_type"'),
    ({"edit_type": "swap"}, "edit_type must be one of replace, refine, reweight"),
    ({"edit_type": "replace", "local_blend_words": ["heart"]}, "local_blend_words .* is not supported"),
    ({"edit_type": "replace", "self_replace_steps": 1.5}, "must lie in 0..1"),
    ({"edit_type": "replace", "self_replace_steps": [0.6, 0.2]}, "start <= end"),
    ({"edit_type": "replace", "cross_replace_steps": {"red": 0.5}}, "a fraction per word .* is not supported"),
    ({"edit_type": "replace", "cross_replace_steps": "most"}, "fraction of the steps"),
    ({"edit_type": "reweight"}, "needs equalizer_words and equalizer_strengths"),
    ({"edit_type": "reweight", "equalizer_words": ["a", "b"], "equalizer_strengths": [1, 2, 3]}, "one per word"),
    ({"edit_type": "replace", "equalizer_words": ["a"], "equalizer_strengths": [2]}, 'belong to edit_type "reweight"'),
])
def test_bad_arguments_are_refused_with_what_to_do(kwargs, message):
    with pytest.raises(ValueError, match=message):
        PromptEdit.from_kwargs(kwargs)
    with pytest.raises(TypeError, match="must be a dict"):
        PromptEdit.from_kwargs([("edit_type", "replace")])


def test_word_maps_swap_one_for_one_or_align_the_shared_words():
    assert word_map("replace", ["red", "heart"], ["blue", "heart"]) == [0, 1]
    assert word_map("refine", ["heart"], ["red", "heart"]) == [-1, 0]
    assert word_map("refine", ["a", "cat", "on", "a", "mat"], ["a", "big", "cat", "on", "a", "red", "mat"]) == \
        [0, -1, 1, 2, 3, -1, 4]
    with pytest.raises(ValueError, match='use edit_type "refine"'):
        word_map("replace", ["heart"], ["red", "heart"])


def test_the_steps_are_counted_as_the_community_pipeline_counts_them():
    plan = edit_plan(PromptEdit("replace", 0.8, (0.2, 0.6)), [["a"], ["b"]]).at_timesteps(range(900, -1, -100))  # 10 steps
    active = [plan.active(t) for t in range(900, -1, -100)]
    assert [c for c, _ in active] == [i < int(0.8 * 11) for i in range(10)]  # alpha over steps + 1 entries
    assert [s for _, s in active] == [int(0.2 * 10) <= i < int(0.6 * 10) for i in range(10)]


# ------------------------------------------------------------------------------------------------------------------
# weighted prompts through sampling
# ------------------------------------------------------------------------------------------------------------------


def test_a_weight_of_one_is_the_plain_prompt_exactly(text_model):
    plain = _images(text_model, num_images=2, prompts=["red apple", "hot tea"], negative_prompts="blurry")
    ones = _images(text_model, num_images=2, prompts=["(red:1) apple", "(hot:1) (tea:1)"],
                   negative_prompts="(blurry:1)")
    assert torch.equal(plain, ones)
    heavier = _images(text_model, num_images=2, prompts=["(red:2) apple", "hot tea"], negative_prompts="blurry")
    assert (heavier[0] - plain[0]).abs().max() > 1e-3 and torch.equal(heavier[1], plain[1])  # only its own image


def test_weighted_prompts_run_the_same_on_the_fused_and_readable_paths(text_model):
    unet = text_model[0]
    fields = dict(num_images=2, prompts=["(red:1.8) apple", "a (hot:0.3) tea"], negative_prompts="(blurry:2)")
    fused = _images(text_model, **fields)
    modules = [m for m in unet.modules() if isinstance(m, MultiHeadAttention)]
    for m in modules:
        m.fused_attn = False
    try:
        readable = _images(text_model, **fields)
    finally:
        for m in modules:
            m.fused_attn = None
    torch.testing.assert_close(fused, readable, rtol=0, atol=1e-4)


def test_a_malformed_weight_is_refused_before_any_work(text_model):
    unet, tok, enc = text_model
    with pytest.raises(ValueError, match="at character 6 of .*not a number"):
        resolve(SampleRequest(prompts="(red:x) apple"), LoadedModel.of(unet, DDIMScheduler(), TextModel(tok, enc)))
    with pytest.raises(ValueError, match="never closed"):
        resolve(SampleRequest(prompts="apple", negative_prompts="(blurry"),
                LoadedModel.of(unet, DDIMScheduler(), TextModel(tok, enc)))
    plan = resolve(SampleRequest(prompts="(red:1.5) apple"), LoadedModel.of(unet, DDIMScheduler(), TextModel(tok, enc)))
    assert plan.words(0) == ("red", "apple") and plan.word_weights(0) == (1.5, 1.0)


# ------------------------------------------------------------------------------------------------------------------
# prompt-to-prompt through sampling
# ------------------------------------------------------------------------------------------------------------------


def test_both_fractions_at_zero_are_a_plain_generation_of_the_target_from_the_same_noise(text_model):
    edited = _images(text_model, num_images=3, prompts=["red apple", "green apple", "red pear"],
                     edit=_edit(cross_replace_steps=0.0, self_replace_steps=0.0))
    for k, prompt in enumerate(["red apple", "green apple", "red pear"]):
        alone = _images(text_model, num_images=1, prompts=prompt)  # image 0 of seed 5: the source's noise
        torch.testing.assert_close(edited[k : k + 1], alone, rtol=0, atol=1e-4)


def test_every_image_of_an_edit_starts_from_image_0s_noise(text_model):
    same = _images(text_model, num_images=2, prompts=["red apple", "red apple"], edit=_edit())
    assert torch.equal(same[0], same[1])  # the same prompt from the same noise, with the source's maps: one picture
    other_seed = _images(text_model, num_images=1, prompts="red apple", seed=BASE["seed"] + 1)
    assert (other_seed[0] - same[1]).abs().max() > 1e-3  # not seed + 1, as plain sampling would give image 1


def test_with_the_fractions_at_1_the_edit_runs_on_the_sources_maps(text_model):
    unet, tok, enc = text_model
    request = SampleRequest(num_images=2, prompts=["red apple", "green apple"], edit=_edit(cross_replace_steps=1.0,
                            self_replace_steps=1.0), **BASE)
    plan = resolve(request, LoadedModel.of(unet, DDIMScheduler(), TextModel(tok, enc)))
    res = run(plan, capture_steps=[0, 3])
    for step in (0, 3):
        for rec in res.attention[step]:
            if rec.kind == "self":
                assert torch.equal(rec.weights((1, 2))[1], rec.weights((1, 2))[0]), rec.name
                if step == 3:  # the negative prompts' rows keep their own maps (equal at step 0: same noise, same "")
                    assert not torch.equal(rec.weights((1, 2))[3], rec.weights((1, 2))[2])
            else:
                for j in range(2):
                    assert torch.equal(rec.token_map(j)[1], rec.token_map(j)[0]), rec.name
    plain = run(plan).images
    assert torch.equal(plain, res.images)  # a captured run gives the same pixels
    assert (plain[1] - plain[0]).abs().max() > 1e-4  # the values still come from the edit's words


def test_refine_and_reweight_keep_the_sources_maps_for_its_words(text_model):
    unet, tok, enc = text_model
    request = SampleRequest(num_images=2, prompts=["apple", "red apple"], edit=_edit(edit_type="refine",
                            cross_replace_steps=1.0, self_replace_steps=0.0), **BASE)
    rec = next(r for r in run(resolve(request, LoadedModel.of(unet, DDIMScheduler(), TextModel(tok, enc))),
                              capture_steps=[1]).attention[1] if r.kind == "cross")
    assert torch.equal(rec.token_map(1)[1], rec.token_map(0)[0])  # "apple" takes the source's "apple"
    request = SampleRequest(num_images=2, prompts=["red apple"] * 2, edit=_edit(
        edit_type="reweight", cross_replace_steps=1.0, self_replace_steps=0.0, equalizer_words=["red"],
        equalizer_strengths=[3.0]), **BASE)
    rec = next(r for r in run(resolve(request, LoadedModel.of(unet, DDIMScheduler(), TextModel(tok, enc))),
                              capture_steps=[1]).attention[1] if r.kind == "cross")
    torch.testing.assert_close(rec.token_map(0)[1], 3.0 * rec.token_map(0)[0], rtol=0, atol=1e-6)
    assert torch.equal(rec.token_map(1)[1], rec.token_map(1)[0])
    with pytest.raises(ValueError, match="equalizer word 'blue' is not in the edited prompt"):
        resolve(SampleRequest(num_images=2, prompts=["red apple"] * 2, edit=_edit(
            edit_type="reweight", equalizer_words=["blue"], equalizer_strengths=[2.0])), LoadedModel.of(unet, DDIMScheduler(), TextModel(tok, enc)))


def test_an_edit_costs_one_guided_image_more_in_one_batched_call_per_step(text_model):
    unet = text_model[0]
    rows = []
    handle = unet.register_forward_hook(lambda m, args, out: rows.append(args[0].shape[0]))
    try:
        _images(text_model, num_images=2, prompts=["red apple", "green apple"], edit=_edit())
    finally:
        handle.remove()
    assert rows == [4] * BASE["steps"]  # (source, edit) x (prompt, negative prompt), once per step


def test_an_edit_is_checked_before_any_work(text_model, class_unet):
    unet, tok, enc = text_model

    def ask(model=unet, text=TextModel(tok, enc), **fields):
        return resolve(SampleRequest(**{**BASE, **fields}), LoadedModel.of(model, DDIMScheduler(), text))

    with pytest.raises(ValueError, match="needs the source prompt and at least one edit"):
        ask(num_images=1, prompts="red apple", edit=_edit())
    with pytest.raises(ValueError, match="set the PAG scale to 0"):
        ask(num_images=2, prompts=["red apple", "green apple"], edit=_edit(),
            guidance=GuidanceRequest(guidance_scale=2.0, pag_scale=1.0))
    with pytest.raises(ValueError, match='use edit_type "refine"'):
        ask(num_images=2, prompts=["apple", "green apple"], edit=_edit())
    with pytest.raises(ValueError, match="takes no prompt"):
        ask(model=class_unet, text=None, num_images=2, prompts=["a", "b"], edit=_edit())
    plan = ask(num_images=2, prompts=["red apple", "green apple"], edit=_edit(), batch_size=1)
    assert plan.batch_size == 2  # the source and its edit attend together
    with pytest.raises(ValueError, match="leave indices out"):
        run(plan, indices=[1])


# ------------------------------------------------------------------------------------------------------------------
# front doors: the diffusers pipeline and the command line
# ------------------------------------------------------------------------------------------------------------------


def test_the_pipeline_takes_the_community_call_and_gives_the_cores_pixels(tmp_path, text_model):
    unet, tok, enc = text_model
    folder = save_pipeline(unet, DDPMScheduler(), tmp_path / "m", text_encoder=enc, tokenizer=tok)
    pipe = DenoiserPipeline.from_pretrained(folder)
    pipe.set_progress_bar_config(disable=True)
    call = dict(prompt=["red apple", "green apple"], num_inference_steps=4, guidance_scale=2.0, output_type="pt")
    piped = pipe(**call, cross_attention_kwargs={"edit_type": "replace", "cross_replace_steps": 0.5,
                                                 "self_replace_steps": 0.25},
                 generator=torch.Generator().manual_seed(5)).images
    code = pipe(**call, cross_attention_kwargs={"edit_type": "replace", "n_cross_replace": 0.5, "n_self_replace": 0.25},
                generator=[torch.Generator().manual_seed(5), torch.Generator().manual_seed(99)]).images
    core = run(resolve(SampleRequest(num_images=2, prompts=call["prompt"], edit=PromptEdit("replace", 0.5, 0.25),
                                     seed=5, steps=4, guidance=GuidanceRequest(guidance_scale=2.0)), folder)).images
    assert piped.shape == (2, 3, 16, 16) and torch.equal(piped, code)  # image 0's generator for both images
    torch.testing.assert_close(piped, core, rtol=0, atol=1e-4)
    with pytest.raises(ValueError, match="unknown key"):
        pipe(**call, cross_attention_kwargs={"edit_type": "replace", "scale": 0.5})


def test_the_cli_writes_the_source_and_its_edit(tmp_path, text_model, capsys):
    import numpy as np
    from PIL import Image

    from denoiser.cli.main import main

    unet, tok, enc = text_model
    folder = save_pipeline(unet, DDPMScheduler(), tmp_path / "m", text_encoder=enc, tokenizer=tok)
    assert main(["sample", "--model", str(folder), "--seed", "5", "--steps", "4", "--guidance-scale", "2",
                 "--prompt", "red apple", "--edit-to", "green apple", "--cross-replace-steps", "0.5",
                 "--out-dir", str(tmp_path / "out")]) == 0
    assert "prompt-to-prompt replace" in capsys.readouterr().out
    pngs = torch.stack([torch.from_numpy(np.array(Image.open(tmp_path / "out" / f"{k:06d}.png").convert("RGB")))
                        .permute(2, 0, 1) for k in range(2)])
    assert not (tmp_path / "out" / "000002.png").exists()
    core = run(resolve(SampleRequest(num_images=2, prompts=["red apple", "green apple"], seed=5, steps=4,
                                     guidance=GuidanceRequest(guidance_scale=2.0), edit=PromptEdit("replace", 0.5)),
                       folder)).images
    assert (pngs.int() - core.mul(255).round().int()).abs().max() <= 1
    assert main(["sample", "--model", str(folder), "--edit-to", "green apple", "--out", str(tmp_path / "x.png")]) == 2
    assert "--edit-to edits a --prompt" in capsys.readouterr().err


def test_the_attention_command_reads_weights_and_labels_the_weighted_word(tmp_path, text_model, capsys):
    from denoiser.cli.main import main

    unet, tok, enc = text_model
    folder = save_pipeline(unet, DDPMScheduler(), tmp_path / "m", text_encoder=enc, tokenizer=tok)
    assert main(["attention", "--model", str(folder), "--steps", "2", "--prompt", "(red:2) apple", "--word", "red",
                 "--out", str(tmp_path / "red.png")]) == 0
    out = capsys.readouterr().out
    assert "word map of '(red:2)'" in out and (tmp_path / "red.png").is_file()
    assert main(["attention", "--model", str(folder), "--steps", "2", "--prompt", "(red:2) apple", "--word", "2",
                 "--out", str(tmp_path / "two.png")]) == 2  # the weight is not a word
    assert "pick one of its words: red, apple" in capsys.readouterr().err

"""Prompts (denoiser/model/text.py): the word-hash tokenizer, the text encoder, a text model's config and --init-from, and
prompts through guidance, the sampling core and the diffusers pipeline (references: separate UNet calls in float64,
the UNet without encoder_hidden_states, a 1-image request per seed)."""

from __future__ import annotations

import copy
import os
import subprocess
import sys

import pytest
import torch
from diffusers import DDIMScheduler, DDPMScheduler, DiffusionPipeline

import denoiser  # noqa: F401  (registers DenoiserPipeline with DiffusionPipeline)
from denoiser.folders.model_dir import LoadedModel, TextModel
from denoiser.model.attention_blocks import SpatialCrossAttention
from denoiser.model.text import HashTextEncoder, PromptedUNet, WordHashTokenizer, encode_prompts, fnv1a, words
from denoiser.model.unet import UNet
from denoiser.request import GuidanceRequest, SampleRequest
from denoiser.sampling.guidance import Guidance, TextCondition
from denoiser.sampling.loop import sample
from denoiser.sampling.pipeline import DenoiserPipeline, save_pipeline
from denoiser.sampling.plan import resolve, run
from denoiser.train.config import RunConfig, apply_overrides, config_from_dict
from denoiser.train.init_from import init_text_encoder, load_init_weights, load_into
from tests.conftest import ROOT, TINY, TRAIN_CONFIG, generators, unet_calls
from tests.data.test_captions import emoji_folder

D = 16  # token width = the UNet's cross_attention_dim
TEXT = dict(num_buckets=512, hidden_size=D, num_layers=1, num_heads=2, max_length=8)
PROMPTS = ["red apple on a wooden table", "cat", "", "hot tea"]  # different lengths, one empty


def _tokenizer(**kwargs) -> WordHashTokenizer:
    return WordHashTokenizer(**{"num_buckets": TEXT["num_buckets"], "max_length": TEXT["max_length"], **kwargs})


def _wake_cross(unet: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Random output projections in every cross-attention block: a fresh block adds exactly nothing, which would
    make every prompt test pass trivially."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in unet.modules():
            if isinstance(m, SpatialCrossAttention):
                p = m.attention.proj
                p.weight.copy_(torch.randn(p.weight.shape, generator=g) * 0.3)
                p.bias.copy_(torch.randn(p.bias.shape, generator=g) * 0.1)
    return unet


@pytest.fixture(autouse=True)
def one_thread():
    """One thread, as `make test`'s workers run: a tiny model on a busy machine only loses to thread hand-offs."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _args(config) -> dict:
    """A component's constructor arguments (a config without diffusers' bookkeeping keys)."""
    return {k: v for k, v in config.items() if not k.startswith("_")}


@pytest.fixture
def text_model():
    """(UNet with live cross-attention, tokenizer, text encoder): a tiny text model."""
    torch.manual_seed(0)
    unet = _wake_cross(UNet(**TINY, cross_attention_dim=D).eval())
    return unet, _tokenizer(), HashTextEncoder(**TEXT).eval()


# ---------------------------------------------------------------------------------------------------------------
# tokenizer
# ---------------------------------------------------------------------------------------------------------------


def test_fnv1a_gives_the_published_test_vectors():
    # the FNV-1a 32-bit reference values (Fowler/Noll/Vo test suite)
    assert fnv1a("") == 0x811C9DC5 and fnv1a("a") == 0xE40C292C and fnv1a("foobar") == 0xBF9CF968


def test_one_token_per_word_with_its_units_ids():
    tok = _tokenizer()
    out = tok(["red apple", "cat"])
    G = tok.config.max_ngrams
    assert out["input_ids"].shape == (2, 2, G) and out["ngram_mask"].shape == (2, 2, G)
    assert out["attention_mask"].tolist() == [[1, 1], [1, 0]]
    for b, prompt in enumerate(["red apple", "cat"]):
        for i, w in enumerate(prompt.split()):
            want = [fnv1a(u) % tok.config.num_buckets for u in tok.units(w)]  # `<w>`, then its n-grams
            used = out["ngram_mask"][b, i]
            assert out["input_ids"][b, i][used].tolist() == want and int(used.sum()) == len(want)
            assert not out["input_ids"][b, i][~used].any()
    # fastText's subwords: the marked word, then its 2-, 3- and 4-grams
    assert tok.units("cat") == ["<cat>", "<c", "ca", "at", "t>", "<ca", "cat", "at>", "<cat", "cat>"]
    assert len(tok.units("x" * 200)) == tok.config.max_ngrams


def test_case_accents_and_punctuation_are_normalised():
    tok = _tokenizer()
    assert words("Café, RED apple!") == ["cafe", "red", "apple"]
    assert words("snake_case") == ["snake", "case"]
    loud, plain = tok("  Café,   RED apple!! "), tok("cafe red apple")
    assert all(torch.equal(loud[k], plain[k]) for k in plain)


@pytest.mark.parametrize(("prompt", "read"), [("🍎❤️", ["🍎", "❤"]), ("red\u200bapple", ["red", "apple"]),
                                              ("👩\u200d🚀 rocket", ["👩", "🚀", "rocket"]), ("\ufeffcat", ["cat"]),
                                              ("co\u00adoperate", ["cooperate"])])
def test_invisible_characters_are_no_words(prompt, read):
    """Issue 72 finding 8: "🍎❤️" listed an invisible third word, the variation selector U+FE0F that asks for the
    heart's colour form; invisible characters (variation selectors, zero-width joiners, a soft hyphen, a byte-order
    mark) are no words of their own and split none; a zero-width space splits, as a space does."""
    assert words(prompt) == read


def test_a_typo_shares_most_units_with_its_word():
    tok = _tokenizer(num_buckets=16384)
    word = set(tok.word_ids("strawberry"))
    typo, other = set(tok.word_ids("strawbery")), set(tok.word_ids("teacup"))
    assert len(word & typo) > 0.5 * len(word)  # a dropped letter keeps most n-grams
    assert len(word & other) < 0.1 * len(word)  # an unrelated word shares (almost) none
    assert tok.word_ids("strawberry") != tok.word_ids("strawbery")  # still another token


@pytest.mark.parametrize("empty", ["", "   ", "!!?", " , . ;"])
def test_a_prompt_without_words_is_a_row_of_padding(empty):
    out = _tokenizer()([empty, "red apple"])
    assert out["attention_mask"][0].tolist() == [0, 0]
    assert not out["ngram_mask"][0].any() and not out["input_ids"][0].any()
    alone = _tokenizer()(empty)
    assert alone["attention_mask"].tolist() == [[0]] and alone["input_ids"].shape[:2] == (1, 1)  # L is at least 1


def test_a_long_prompt_is_cut_at_max_length_and_dropped_lists_the_rest():
    tok = _tokenizer()
    prompt = " ".join(f"word{i}" for i in range(200))
    L = tok.config.max_length
    assert tok.tokens(prompt) == [f"word{i}" for i in range(L)]
    assert tok.dropped(prompt) == [f"word{i}" for i in range(L, 200)]
    assert tok.dropped("red apple") == []
    out = tok([prompt, "red"])
    assert out["input_ids"].shape[1] == L and out["attention_mask"][0].all()
    short = tok(" ".join(f"word{i}" for i in range(L)))
    assert torch.equal(out["input_ids"][:1], short["input_ids"])


@pytest.mark.parametrize("bad", [None, 3, ["red", 3], [b"red"], ("a", None)])
def test_non_strings_are_refused(bad):
    with pytest.raises(TypeError):
        _tokenizer()(bad)


def test_ids_are_the_same_in_another_process():
    """fnv1a, not Python's salted hash(): a fresh process whose hash() differs from this one's gets the same ids."""
    prompts = ["red apple", "Teacup without handle"]
    code = ("from denoiser.model.text import WordHashTokenizer; "
            f"print(hash('red apple')); print(WordHashTokenizer(num_buckets=1000)({prompts!r})['input_ids'].tolist())")
    seed = "2" if os.environ.get("PYTHONHASHSEED") == "1" else "1"
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True, timeout=300,
                         env={**os.environ, "PYTHONHASHSEED": seed, "OMP_NUM_THREADS": "1"})
    other_hash, other_ids = res.stdout.splitlines()
    assert int(other_hash) != hash("red apple")  # the salted hash does differ between the two processes
    assert other_ids == str(WordHashTokenizer(num_buckets=1000)(prompts)["input_ids"].tolist())


def test_tokenizer_save_and_load_round_trip(tmp_path):
    tok = WordHashTokenizer(num_buckets=300, min_n=3, max_n=5, max_length=7, max_ngrams=11)
    tok.save_pretrained(tmp_path / "tokenizer")
    assert sorted(p.name for p in (tmp_path / "tokenizer").iterdir()) == [WordHashTokenizer.config_name]  # no weights
    back = WordHashTokenizer.from_pretrained(tmp_path / "tokenizer")
    assert _args(back.config) == _args(tok.config)
    prompt = ["a very long prompt with quite a lot of words in it", "Café"]
    a, b = tok(prompt), back(prompt)
    assert all(torch.equal(a[k], b[k]) for k in a)
    with pytest.raises(ValueError, match="min_n <= max_n"):
        WordHashTokenizer(min_n=4, max_n=2)


# ---------------------------------------------------------------------------------------------------------------
# text encoder
# ---------------------------------------------------------------------------------------------------------------


def test_the_encoder_is_zero_at_padding_and_word_vectors_ignore_the_batchs_padding():
    tok, enc = _tokenizer(), HashTextEncoder(**TEXT).eval()
    with torch.no_grad():
        alone = enc(**tok("red apple"))  # (1, 2, D)
        batch = enc(**tok(["red apple", "a cat on a mat in the sun"]))  # (2, 8, D): row 0 padded with 6
    assert batch.shape == (2, 8, D)
    assert torch.equal(batch[0, 2:], torch.zeros(6, D))  # padding: exactly zero
    torch.testing.assert_close(batch[0, :2], alone[0], rtol=1e-5, atol=1e-6)
    with torch.no_grad():  # as `batch` was made (torch's fast transformer path)
        states, mask = encode_prompts(tok, enc, ["red apple", "a cat on a mat in the sun"])
    assert torch.equal(states, batch) and mask.tolist() == [[1, 1] + [0] * 6, [1] * 8]


def test_the_words_of_a_prompt_see_each_other():
    """'red' in 'red apple' and in 'red heart' differ (the transformer over the words), yet is one token each."""
    tok, enc = _tokenizer(), HashTextEncoder(**TEXT).eval()
    with torch.no_grad():
        out = enc(**tok(["red apple", "red heart"]))
    assert (out[0, 0] - out[1, 0]).abs().max() > 1e-4


@pytest.mark.parametrize("prompts", [["", "red apple"], ["", "  "]], ids=["one-empty-row", "all-rows-empty"])
def test_an_all_padding_row_gives_zeros_and_finite_gradients(prompts):
    tok, enc = _tokenizer(), HashTextEncoder(**TEXT)
    out = enc(**tok(prompts))
    assert torch.equal(out[0], torch.zeros_like(out[0])) and torch.isfinite(out).all()
    (out * torch.randn_like(out)).sum().backward()
    grads = [p.grad for p in enc.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)
    if words(prompts[1]):
        assert any(g.abs().sum() > 0 for g in grads)  # the real row trains the encoder


def test_prompted_unet_is_the_unet_fed_by_its_encoder_and_trains_it(text_model):
    unet, tok, enc = text_model
    model = PromptedUNet(unet, enc)
    tokens = tok(["red apple", "cat"])
    x, t = torch.randn(2, 3, 16, 16), torch.tensor([10, 600])
    out = model(x, t, **tokens).sample
    with torch.no_grad():
        want = unet(x, t, encoder_hidden_states=enc(**tokens), encoder_attention_mask=tokens["attention_mask"]).sample
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-6)
    out.square().mean().backward()
    grad = enc.embed.weight.grad  # (num_buckets, D): nonzero exactly at the buckets the prompts use
    used = torch.zeros(TEXT["num_buckets"], dtype=torch.bool)
    used[tokens["input_ids"][tokens["ngram_mask"]]] = True
    assert (grad[used].abs().sum(1) > 0).all() and not grad[~used].any()


# ---------------------------------------------------------------------------------------------------------------
# guidance and sampling with prompts
# ---------------------------------------------------------------------------------------------------------------


def test_an_empty_prompt_is_no_condition(text_model):
    unet, tok, enc = text_model
    x, t = torch.randn(3, 3, 16, 16), torch.tensor(400)
    empty = TextCondition.encode(tok, enc, ["", "", ""])
    prompted = TextCondition.encode(tok, enc, ["red apple", "", "cat"])
    with torch.no_grad():
        plain = unet(x, t).sample  # no encoder_hidden_states at all
        assert torch.equal(unet(x, t, **empty.kwargs("c")).sample, plain)
        live = unet(x, t, **prompted.kwargs("c")).sample
    assert (live[0] - plain[0]).abs().max() > 1e-3  # a prompt does change the output (the reference is not trivial)
    # through the sampling core: prompts "" give the images of the UNet sampled without any text
    request = SampleRequest(num_images=3, prompts="", seed=5, steps=3, batch_size=3)
    got = run(resolve(request, LoadedModel.of(unet, DDIMScheduler(), TextModel(tok, enc)))).images
    want = sample(unet, DDIMScheduler(), 3, 3, seed=5).images
    assert torch.equal(got, want)


def test_text_condition_pads_row_groups_to_the_longest_prompt(text_model):
    _, tok, enc = text_model
    cond = TextCondition.encode(tok, enc, ["red apple on a wooden table", "cat"], ["blurry", ""])
    assert cond.states.shape == (2, 6, D) and cond.negative_states.shape == (2, 1, D)
    kw = cond.kwargs("cuc")
    states, mask = kw["encoder_hidden_states"], kw["encoder_attention_mask"]
    assert states.shape == (6, 6, D) and mask.shape == (6, 6) and mask.dtype == torch.bool
    assert torch.equal(states[:2], cond.states) and torch.equal(states[4:], cond.states)
    assert torch.equal(states[2:4, :1], cond.negative_states) and not states[2:4, 1:].any()
    word, one, none = [True] * 6, [True] + [False] * 5, [False] * 6
    assert mask.tolist() == [word, one, one, none, word, one]


def test_classifier_free_guidance_with_prompts_equals_separate_calls_in_float64(text_model):
    unet, tok, enc = text_model
    unet, enc = copy.deepcopy(unet).double(), copy.deepcopy(enc).double()
    prompts, negative = ["red apple on a wooden table", "cat", "hot tea"], ["blurry", "", "a dog in the rain"]
    cond = TextCondition.encode(tok, enc, prompts, negative)
    x, t, w = torch.randn(3, 3, 16, 16, dtype=torch.float64), torch.tensor(700), 3.0
    with torch.no_grad():
        guided = Guidance(scale=w).predictor(unet, None, cond)(x, t)

        def alone(i: int, prompt: str) -> torch.Tensor:  # one image, its prompt unpadded
            states, mask = encode_prompts(tok, enc, [prompt])
            return unet(x[i : i + 1], t, encoder_hidden_states=states, encoder_attention_mask=mask).sample

        c = torch.cat([alone(i, p) for i, p in enumerate(prompts)])
        u = torch.cat([alone(i, p) for i, p in enumerate(negative)])
    assert (c - u).abs().max() > 1e-3
    torch.testing.assert_close(guided, u + w * (c - u), rtol=1e-10, atol=1e-10)


def test_prompts_over_rows_per_call_run_as_calls_of_whole_images_but_an_edits_stay_one(text_model, monkeypatch):
    """main_pass's calls of whole images (tests/sampling/test_guidance.py) take each image's own prompt, negative prompt and
    word weights; a prompt-to-prompt edit's images read image 0's maps, so they stay one call."""
    from denoiser.request import PromptEdit
    from denoiser.sampling import guidance

    unet, tok, enc = text_model
    unet, enc = copy.deepcopy(unet).double(), copy.deepcopy(enc).double()
    prompts, negative = ["(red:1.6) apple on a wooden table", "cat", "", "hot (tea:0.5)"], ["blurry", "", "a dog", ""]
    cond = TextCondition.encode(tok, enc, prompts, negative)
    x, t, g = torch.randn(4, 3, 16, 16, dtype=torch.float64), torch.tensor(700), Guidance(scale=3.0)
    with torch.no_grad(), unet_calls(unet) as rows:
        whole = g.main_pass(unet, x, t, None, cond)
        monkeypatch.setattr(guidance, "ROWS_PER_CALL", 2)  # 1 image, its 2 rows, a call
        split = g.main_pass(unet, x, t, None, cond)
        assert rows == [8, 2, 2, 2, 2]
        for a, b in zip(split, whole, strict=True):
            torch.testing.assert_close(a, b, rtol=0, atol=1e-12)
        assert (whole[0] - whole[1]).abs().max() > 1e-3  # the prompts and the negative prompts differ
        rows.clear()
        edited = TextCondition.encode(tok, enc, ["a red apple", "a blue apple"], edit=PromptEdit("replace", 0.8, 0.4))
        g.main_pass(unet, x[:2], t, None, edited.at_timesteps([700]))
        assert rows == [4]
    with pytest.raises(ValueError, match="one batch"):
        edited.images(0, 1)


def test_the_seed_rule_holds_for_prompts_whatever_the_batch(text_model):
    unet, tok, enc = text_model
    base = dict(seed=3, steps=3, guidance=GuidanceRequest(guidance_scale=2.0), negative_prompts="blurry")

    def images(**fields) -> torch.Tensor:
        return run(resolve(SampleRequest(**{**base, **fields}), LoadedModel.of(unet, DDIMScheduler(), TextModel(tok, enc)))).images

    whole = images(num_images=4, prompts=PROMPTS, batch_size=4)
    for k in range(4):  # image k of the request is image 0 of a 1-image request seeded seed + k
        one = images(num_images=1, prompts=PROMPTS[k], seed=3 + k)
        torch.testing.assert_close(one, whole[k : k + 1], rtol=0, atol=1e-4)
    for batch_size in (1, 3):
        torch.testing.assert_close(images(num_images=4, prompts=PROMPTS, batch_size=batch_size), whole, rtol=0, atol=1e-4)
    assert (whole[0] - images(num_images=1, prompts="hot tea", seed=3)[0]).abs().max() > 1e-3  # the prompt matters


def test_prompts_are_checked_and_long_ones_warned_about(text_model, class_unet, caplog):
    unet, tok, enc = text_model
    with pytest.raises(ValueError, match=r"one prompt or one per image \(3\)"):
        resolve(SampleRequest(num_images=3, prompts=["a", "b"]), LoadedModel.of(unet, DDIMScheduler(), TextModel(tok, enc)))
    with pytest.raises(ValueError, match="no text encoder was found"):
        resolve(SampleRequest(num_images=1, prompts="a"), LoadedModel.of(unet, DDIMScheduler()))
    with pytest.raises(ValueError, match="leave the prompt out and pick a class"):
        resolve(SampleRequest(num_images=1, prompts="cat"), LoadedModel.of(class_unet, DDIMScheduler()))
    long = " ".join(f"w{i}" for i in range(12))
    with caplog.at_level("WARNING", logger="denoiser.sampling.plan"):
        plan = resolve(SampleRequest(num_images=2, prompts=long, steps=1), LoadedModel.of(unet, DDIMScheduler(), TextModel(tok, enc)))
        assert not caplog.text  # resolving says nothing (the app resolves on every keystroke: issue 60 item 7)
        assert plan.prompts == (long, long) and plan.negative_prompts == ("", "")
        assert plan.unread(1) == ("w8", "w9", "w10", "w11")
        run(plan)
    # the run says it once, for the two images' one prompt
    assert caplog.text.count("reads only the first 8 words") == 1 and "w8 w9 w10 w11" in caplog.text


# ---------------------------------------------------------------------------------------------------------------
# the diffusers pipeline and model folders
# ---------------------------------------------------------------------------------------------------------------


def test_a_text_model_folder_loads_in_diffusers_and_samples_as_the_core_does(tmp_path, text_model):
    unet, tok, enc = text_model
    folder = save_pipeline(unet, DDPMScheduler(), tmp_path / "m", text_encoder=enc, tokenizer=tok)
    pipe = DiffusionPipeline.from_pretrained(folder)
    pipe.set_progress_bar_config(disable=True)
    assert isinstance(pipe, DenoiserPipeline) and isinstance(pipe.scheduler, DDIMScheduler)
    assert isinstance(pipe.text_encoder, HashTextEncoder) and isinstance(pipe.tokenizer, WordHashTokenizer)
    assert _args(pipe.tokenizer.config) == _args(tok.config)
    saved = pipe.text_encoder.state_dict()
    assert all(torch.equal(saved[k], v) for k, v in enc.state_dict().items())
    prompts = ["red apple", "a cat on a mat"]
    piped = pipe(prompt=prompts, negative_prompt="blurry", guidance_scale=2.0, num_inference_steps=3,
                 generator=generators(7, 2), output_type="pt").images
    request = SampleRequest(num_images=2, prompts=prompts, negative_prompts="blurry", guidance=GuidanceRequest(guidance_scale=2.0),
                            seed=7, steps=3)
    core = run(resolve(request, folder)).images  # the folder's own text encoder (load_text), channels-last UNet
    assert piped.shape == (2, 3, 16, 16)
    torch.testing.assert_close(piped, core, rtol=0, atol=1e-4)
    swapped = pipe(prompt=prompts[::-1], negative_prompt="blurry", guidance_scale=2.0, num_inference_steps=3,
                   generator=generators(7, 2), output_type="pt").images
    assert (swapped - piped).abs().max() > 1e-3


def test_the_cli_samples_and_scores_prompts_as_the_core_does(tmp_path, text_model, monkeypatch, capsys):
    import numpy as np
    from PIL import Image

    from denoiser.cli.main import main
    from denoiser.evaluate.fid import Statistics

    unet, tok, enc = text_model
    folder = save_pipeline(unet, DDPMScheduler(), tmp_path / "m", text_encoder=enc, tokenizer=tok)
    flags = ["--model", str(folder), "--seed", "7", "--steps", "3", "--guidance-scale", "2", "--batch-size", "2"]
    assert main(["sample", *flags, "--num-images", "2", "--prompt", "red apple", "--negative-prompt", "blurry",
                 "--out-dir", str(tmp_path / "out")]) == 0
    pngs = torch.stack([torch.from_numpy(np.array(Image.open(tmp_path / "out" / f"{k:06d}.png").convert("RGB"))).permute(2, 0, 1)
                        for k in range(2)])
    request = dict(prompts="red apple", negative_prompts="blurry", guidance=GuidanceRequest(guidance_scale=2.0), seed=7,
                   steps=3)
    core = run(resolve(SampleRequest(num_images=2, **request), folder)).images
    assert (pngs.int() - core.mul(255).round().int()).abs().max() <= 1
    # evaluate --fid --prompts FILE: the file's lines cycled over the images
    scored = []
    monkeypatch.setattr("denoiser.evaluate.fid.fid_of_images", lambda images, *a, **k: scored.append(images) or 1.0)
    monkeypatch.setattr("denoiser.evaluate.fid.InceptionFeatures", lambda *a, **k: None)
    monkeypatch.setattr("denoiser.evaluate.fid.reference_statistics", lambda *a, **k: Statistics(torch.zeros(1), torch.eye(1), 1, 16))
    (tmp_path / "prompts.txt").write_text("red apple\n\nhot tea\n")
    assert main(["evaluate", "--fid", "--num-samples", "3", "--reference", "r.safetensors", *flags,
                 "--prompts", str(tmp_path / "prompts.txt")]) == 0
    capsys.readouterr()
    cycled = run(resolve(SampleRequest(num_images=3, **{**request, "prompts": ["red apple", "hot tea", "red apple"],
                                                        "negative_prompts": None}), folder)).images
    assert (scored[0].int() - cycled.mul(255).round().int()).abs().max() <= 1


def test_a_class_model_folder_has_no_text_and_refuses_a_prompt(tmp_path, class_unet):
    folder = save_pipeline(class_unet, DDPMScheduler(), tmp_path / "c")
    pipe = DiffusionPipeline.from_pretrained(folder)
    pipe.set_progress_bar_config(disable=True)
    assert pipe.text_encoder is None and pipe.tokenizer is None
    assert pipe(class_labels=1, num_inference_steps=1, output_type="pt").images.shape == (1, 3, 16, 16)
    with pytest.raises(ValueError, match="leave the prompt out"):
        pipe(prompt="cat", num_inference_steps=1)
    with pytest.raises(ValueError, match="both its text_encoder and its tokenizer"):
        DenoiserPipeline(class_unet, DDIMScheduler(), text_encoder=HashTextEncoder(**TEXT))


# ---------------------------------------------------------------------------------------------------------------
# config and --init-from
# ---------------------------------------------------------------------------------------------------------------


def _text_config(tmp_path, **sections) -> dict:
    root = tmp_path / "emoji" if (tmp_path / "emoji").is_dir() else emoji_folder(tmp_path / "emoji")
    raw = {k: dict(v) for k, v in TRAIN_CONFIG.items()}
    raw["model"].update(num_class_embeds=None, cross_attention_dim=D)
    raw["data"] = {"dataset": "folder", "path": str(root), "caption_columns": ["name", "keywords"], "val_size": 0}
    raw["text"] = {"hidden_size": D, "num_heads": 2}
    for name, values in sections.items():
        raw.setdefault(name, {}).update(values)
    return raw


def test_a_text_config_loads_and_its_mistakes_are_explained(tmp_path):
    cfg = config_from_dict(_text_config(tmp_path))
    assert cfg.prompted and cfg.text.hidden_size == D and not config_from_dict(TRAIN_CONFIG).prompted
    for sections, message in [
        ({"text": {"hidden_size": 32}}, r"model.cross_attention_dim \(16\) must equal text.hidden_size \(32\)"),
        ({"data": {"caption_columns": []}}, "learns from captions: set data.caption_columns"),
        ({"text": {"num_heads": 3}}, r"text.hidden_size \(16\) must be divisible by text.num_heads \(3\)"),
        ({"text": {"vocab": 3}}, "text.vocab is unknown"),
    ]:
        with pytest.raises(ValueError, match=message):
            config_from_dict(_text_config(tmp_path, **sections))


def test_bare_overrides_keep_their_sections_and_text_takes_dotted_keys():
    assert apply_overrides({}, ["num_heads=8"]) == {"model": {"num_heads": 8}}  # model's, as before text existed
    assert apply_overrides({}, ["text.num_heads=8"]) == {"text": {"num_heads": 8}}
    assert apply_overrides({}, ["num_buckets=100"]) == {"text": {"num_buckets": 100}}  # text's alone


def test_a_class_model_gaining_cross_attention_starts_as_its_no_class_self(tmp_path, class_unet):
    with torch.no_grad():  # a trained table: the null row is not zero
        torch.nn.init.normal_(class_unet.class_embed.weight)
    folder = save_pipeline(class_unet, DDPMScheduler(), tmp_path / "c")
    cfg = RunConfig(model=dict(TINY, cross_attention_dim=D))
    new = UNet(**cfg.model).eval()
    fresh = load_into(new, load_init_weights(cfg, str(folder)))
    assert fresh and all(".cross." in k or k.startswith("mid_cross.") for k in fresh)
    assert new.class_embed is None
    enc, tok = HashTextEncoder(**TEXT).eval(), _tokenizer()
    x, t = torch.randn(2, 3, 16, 16), torch.tensor([30, 800])
    with torch.no_grad():
        before = class_unet(x, t, class_labels=torch.tensor([3, 3])).sample  # the "no class" row
        for prompts in (["", ""], ["red apple", "cat"]):  # zero output projections: no prompt changes it yet
            states, mask = encode_prompts(tok, enc, prompts)
            after = new(x, t, encoder_hidden_states=states, encoder_attention_mask=mask).sample
            assert torch.allclose(after, before, rtol=1e-5, atol=1e-6)
    assert (before - class_unet(x, t, class_labels=torch.tensor([0, 0])).sample).abs().max() > 1e-3  # the null row counts
    assert not init_text_encoder(HashTextEncoder(**TEXT), str(folder))  # no text encoder there: it starts fresh


def test_init_from_keys_other_than_cross_attention_must_all_be_there(tmp_path, class_unet, text_model):
    folder = save_pipeline(class_unet, DDPMScheduler(), tmp_path / "c")
    cfg = RunConfig(model=dict(TINY, cross_attention_dim=D))
    state = load_init_weights(cfg, str(folder))
    missing = dict(state)
    missing.pop("conv_in.weight")
    with pytest.raises(ValueError, match=r"do not fit this model: \['conv_in.weight'\]"):
        load_into(UNet(**cfg.model), missing)
    with pytest.raises(ValueError, match="do not fit this model"):
        load_into(UNet(**cfg.model), {**state, "extra.weight": torch.zeros(1)})
    # a text model continued keeps its text encoder; another token width is another architecture
    unet, tok, enc = text_model
    text_folder = save_pipeline(unet, DDPMScheduler(), tmp_path / "t", text_encoder=enc, tokenizer=tok)
    again = HashTextEncoder(**TEXT)
    assert init_text_encoder(again, str(text_folder))
    assert all(torch.equal(again.state_dict()[k], v) for k, v in enc.state_dict().items())
    assert load_into(UNet(**cfg.model), load_init_weights(cfg, str(text_folder))) == []
    with pytest.raises(ValueError, match="another architecture"):
        load_init_weights(RunConfig(model=dict(TINY, cross_attention_dim=2 * D)), str(text_folder))

"""The app with a text model: the prompt reaches the images, each word's map is the captured record's, and the
page offers a prompt instead of a class."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import httpx
import pytest
import torch
from diffusers import DDPMScheduler

from denoiser import UNet
from denoiser.app.attention_tab import AttentionTab
from denoiser.app.engine import Engine
from denoiser.app.form import SETTINGS_FORM, ModelForm
from denoiser.app.png_settings import read_settings
from denoiser.app.sample_tab import SampleTab
from denoiser.model.text import HashTextEncoder
from denoiser.request import GuidanceRequest, SampleRequest
from denoiser.sampling.pipeline import save_pipeline
from denoiser.sampling.plan import resolve, run
from tests.app.browser import CHROMIUM, browser_page, no_errors, screenshots
from tests.conftest import TINY, app_page
from tests.model.test_text import TEXT, D, _tokenizer, _wake_cross

WORDS_EXAMPLES = ["blue car", "red apple", "hot tea"]  # the "words" model's example prompts (its sampling.json)


@pytest.fixture(scope="module")
def weights(tmp_path_factory):
    """A tiny text model ("words": live cross-attention, guidance 2.5 and WORDS_EXAMPLES in its sampling.json) and a
    class model."""
    root = tmp_path_factory.mktemp("weights")
    torch.manual_seed(0)
    unet = _wake_cross(UNet(**TINY, cross_attention_dim=D).eval())
    save_pipeline(unet, DDPMScheduler(), root / "words", text_encoder=HashTextEncoder(**TEXT).eval(),
                  tokenizer=_tokenizer())
    (root / "words" / "sampling.json").write_text(json.dumps({"guidance_scale": 2.5, "example_prompts": WORDS_EXAMPLES}))
    save_pipeline(UNet(**TINY, num_class_embeds=3).eval(), DDPMScheduler(), root / "tiny-classes")
    return root


def test_prompt_reaches_the_images(weights):
    ex = Engine(weights)
    gen = ex.generate("words", SampleRequest(scheduler="ddim", steps=3, seed=5, num_images=2, prompts="red apple",
                                             guidance=GuidanceRequest(guidance_scale=2.0)))
    plan = resolve(SampleRequest(num_images=2, prompts="red apple", seed=5, scheduler="ddim", steps=3,
                                 guidance=GuidanceRequest(guidance_scale=2.0), batch_size=2), weights / "words")
    assert torch.equal(gen.images, run(plan).images)
    assert gen.prompt == "red apple" and gen.words == ("red", "apple")
    other = ex.generate("words", SampleRequest(scheduler="ddim", steps=3, seed=5, num_images=2, prompts="blue car",
                                               guidance=GuidanceRequest(guidance_scale=2.0)))
    assert not torch.allclose(other.images, gen.images)  # the prompt changes the pictures


def test_word_map_and_pixel_weights_are_the_records(weights):
    ex = Engine(weights)
    gen = ex.generate("words", SampleRequest(scheduler="ddim", steps=3, seed=0, num_images=2, prompts="red apple",
                                             guidance=GuidanceRequest(guidance_scale=2.0)))
    cross = ex.views.records(gen, 1, "cross")
    assert cross and all(r.kind == "cross" for r in cross)
    assert all(r.kind == "self" for r in ex.views.records(gen, 1))  # the pixel-to-pixel views never see a cross layer
    maps = ex.views.word_maps(gen, 1, 1, 1)  # image 1, step 1, "apple"
    assert len(maps) == len(cross)
    for (label, m), r in zip(maps, cross):
        assert r.name in label
        torch.testing.assert_close(m, r.token_map(1)[1])
    weights_ = ex.views.word_weights(gen, 1, 1, (5, 9))
    for (_, w), r in zip(weights_, cross):
        H, W = r.size
        S = gen.images.shape[-1]
        torch.testing.assert_close(w, r.weights((5 * H // S, 9 * W // S))[1, :, :2])
        torch.testing.assert_close(w.sum(-1), torch.ones(w.shape[0]))  # every head's weights are on the two words
    with pytest.raises(ValueError, match="word"):
        ex.views.word_maps(gen, 0, 1, 2)  # the prompt has two words


def test_handlers_show_prompt_and_hide_class(weights, tmp_path, monkeypatch):
    monkeypatch.setenv("GRADIO_TEMP_DIR", str(tmp_path))
    page = app_page(weights)
    sample, views = page.tab(SampleTab), page.tab(AttentionTab)
    prompt, negative, examples, _ = page.form.text_controls("words")
    assert prompt["visible"] and negative["visible"] and examples["visible"]
    prompt, negative, examples, _ = page.form.text_controls("tiny-classes")
    assert not prompt["visible"] and "value" not in prompt and not examples["visible"]  # kept for the next text model
    class_update, guidance, *_ = page.form.model_form("words")
    assert not class_update["visible"]
    assert guidance["value"] == 2.5 and "prompt" in guidance["label"]  # the folder's sampling.json, for a prompt
    assert page.form.cfg_default("words", "(any)")["value"] == 1.0  # the Photo tab runs a text model without a prompt
    row = page.form.example_row("words", 0)
    assert row[5] == "(any)" and row[-1] and row[6] == 2.5  # a prompt, not a class
    _, _, scheduler, steps, *_ = page.form.model_form("words")
    assert row[1:3] == [scheduler["value"], steps["value"]]  # "try these" samples as the model's own form does
    *_, last = sample.generate("words", "ddim", 2, 3, 2, "(any)", 2.5, 0.0, 1.0, "(the model's)", 0.0, "", "", "red apple", "")
    assert set(last) == set(sample.outputs)  # done: every output set
    gallery, gen, status = last[sample.gallery], last[page.generation], last[sample.status]
    assert gen.prompt == "red apple" and "red apple" in status
    settings = read_settings(gallery[0])
    assert settings["prompt"] == "red apple" and "negative_prompt" not in settings
    assert "red_apple" in gallery[0]
    words = last[views.words]  # the words the Attention tab lists
    assert words["choices"] == [("red", 0), ("apple", 1)] and words["visible"]
    restored = page.form.use_settings(gallery, 0)
    form = dict(zip(SETTINGS_FORM, restored))
    assert form["prompt"]["value"] == "red apple" and form["prompt"]["visible"]
    word_map, pixel_weights = views.word_views(gen, 0, 1, (3, 4), 1)
    assert word_map is not None and pixel_weights is not None
    each_head, _ = views.word_views(gen, 0, 1, (3, 4), 1, True)  # "each head": a row per layer
    assert each_head["value"].height > word_map["value"].height and "“apple”" in word_map["label"]
    assert views.word_views(gen, 0, 1, None, None) == (None, None)


def test_a_generate_reads_its_prompt_once(weights, tmp_path, monkeypatch, prompt_reads):
    """Issue 72 part 5: the review counted the prompt parsed 5 times on its way from the form to the pictures (14 calls
    in all: the engine's check, resolve, the encoding, the words, weights and notes). The form passes the prompt as
    typed, resolve reads it once, and the plan carries the reading to the encoding, the word lists and the notes."""
    monkeypatch.setenv("GRADIO_TEMP_DIR", str(tmp_path))
    sample = app_page(weights).tab(SampleTab)
    read = prompt_reads
    *_, last = sample.generate("words", "ddim", 2, 0, 1, "(any)", 2.5, 0.0, 1.0, "(the model's)", 0.0, "", "",
                               "(red:1.5) apple", "")
    assert str(last[sample.status]).startswith("done: 1 image(s) of “\\(red:1.5\\) apple”"), last[sample.status]
    assert read["(red:1.5) apple"] == 1, read


def test_class_model_ignores_a_hidden_prompt(weights, tmp_path, monkeypatch):
    monkeypatch.setenv("GRADIO_TEMP_DIR", str(tmp_path))
    page = app_page(weights)
    sample = page.tab(SampleTab)
    *_, last = sample.generate("tiny-classes", "ddim", 2, 0, 1, "(any)", 1.0, 0.0, 1.0, "(the model's)",
                          0.0, "", "", "left over", "")
    assert "prompt" not in read_settings(last[sample.gallery][0])
    assert not last[page.generation].words


def test_edit_and_heads_run_a_text_model_unconditioned(weights):
    from PIL import Image

    ex = Engine(weights)
    photo = Image.new("RGB", (16, 16), (200, 40, 40))
    gen, done = ex.restore("words", ex.restore_request("edit", strength=0.5, steps=4), photo)
    assert gen.images.shape == (1, 3, 16, 16) and not gen.words
    with pytest.raises(ValueError, match="without a prompt"):
        ex.restore("words", ex.restore_request("edit", guidance_scale=2.0, strength=0.5, steps=4), photo)
    rows, _ = ex.views.head_table(gen, 0, timesteps=(500,))
    assert rows
    sampled = ex.generate("words", SampleRequest(scheduler="ddim", steps=2, seed=0, num_images=1, prompts="red apple"))
    assert ex.views.attention_maps(sampled, 0, 1, (2, 3)) is not None  # the self-attention views as for any model
    assert ex.views.ablate(sampled, ["mid_attn"]).images.shape == sampled.images.shape


@pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="make test installs Debian's chromium")
def test_browser_a_typed_prompt_is_what_the_result_shows(server, tmp_path):
    """Pick the text model, type a prompt, Generate: the status line, the result's PNG and the Attention tab's words
    are the prompt's; the class selector is hidden."""
    with browser_page(server) as page:
        page.locator("#model input").click()
        page.locator("#model").get_by_role("option", name="words").click()
        page.locator("#prompt textarea").wait_for(state="visible", timeout=30_000)
        # the class selector is hidden by the model's form (a queued event of its own, after the prompt shows): wait
        # for it, a timeout fails the test
        page.locator("#class").wait_for(state="hidden", timeout=30_000)
        page.locator("#prompt textarea").fill("red apple")
        page.locator("#steps input[type=number]").fill("2")
        page.locator("#steps input[type=number]").press("Enter")
        page.locator("#budget").get_by_text("work:").wait_for(timeout=30_000)
        page.locator("#generate").click()
        page.locator("#status").get_by_text("done:").wait_for(timeout=120_000)
        assert "red apple" in page.locator("#status").inner_text()
        src = page.locator("#gallery img").first.get_attribute("src")
        (tmp_path / "first.png").write_bytes(httpx.get(src, timeout=30).content)
        assert read_settings(tmp_path / "first.png")["prompt"] == "red apple"
        page.get_by_role("tab", name="Attention").click()
        page.locator("#words").get_by_text("apple").click()
        page.locator("#word-maps img").wait_for(timeout=60_000)
        two_rows = page.locator("#word-maps img").evaluate("img => img.decode().then(() => img.naturalHeight)")
        page.locator("#word-heads input").check()  # a row per layer, each head's map in it
        page.wait_for_function(f"() => {{ const i = document.querySelector('#word-maps img'); "
                               f"return i && i.complete && i.naturalHeight > {two_rows}; }}", timeout=60_000)
        no_errors(page)


def test_the_photo_tab_takes_a_prompt_for_edit_and_inpaint(weights, tmp_path, monkeypatch):
    """A text model's prompt box on the Photo tab: shown for edit and inpaint (emptied otherwise), a typed prompt sets
    the model's guidance, the result's PNG carries the prompt and "use these settings" reads it back."""
    from PIL import Image

    from denoiser.app.photo_tab import PHOTO_FORM, PhotoTab

    monkeypatch.setenv("GRADIO_TEMP_DIR", str(tmp_path))
    page = app_page(weights)
    e = page.tab(PhotoTab)
    assert e.prompt_box("words", "edit")["visible"] and e.prompt_box("words", "inpaint")["visible"]
    for model, operation in (("words", "denoise"), ("words", "denoise (sampled)"), ("tiny-classes", "edit")):
        box = e.prompt_box(model, operation)
        assert not box["visible"] and box["value"] == ""
    assert e.prompt_cfg("words", "(any)", "red apple")["value"] == 2.5  # the folder's sampling.json
    assert e.prompt_cfg("words", "(any)", "  ")["value"] == 1.0  # no prompt: unconditioned, CFG off
    photo = Image.new("RGB", (16, 16), (200, 40, 40))
    editor = {"background": photo, "layers": [], "composite": photo}
    *_, last = e.run_photo("words", "(any)", 2.5, editor, "edit", 0.0, 0.6, 0.0, 4, 0, prompt="red apple")
    gallery, gen = last[e.result], last[page.generation]
    assert gen.words == ("red", "apple") and last[e.status].startswith("done: edit")
    out = e.use_settings(gallery, 0)
    form = dict(zip(PHOTO_FORM, out[:-1]))
    assert form["prompt"]["value"] == "red apple" and form["guidance_scale"]["value"] == 2.5



@pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="make test installs Debian's chromium")
def test_browser_the_photo_tabs_prompt_box_follows_the_model_and_operation(server):
    with browser_page(server) as page:
        page.get_by_role("tab", name="Photo").click()
        page.locator("#photo-model input").click()
        page.locator("#photo-model").get_by_role("option", name="words").click()
        page.locator("#operation").get_by_text("edit", exact=True).click()
        page.locator("#photo-prompt textarea").wait_for(state="visible", timeout=30_000)
        page.locator("#photo-prompt textarea").press_sequentially("red apple")  # typed, as a person does
        page.wait_for_function("() => document.querySelector('#photo-cfg input[type=number]').value === '2.5'",
                               timeout=30_000)  # a typed prompt: the model's guidance
        page.locator("#operation").get_by_text("denoise", exact=True).click()
        page.locator("#photo-prompt textarea").wait_for(state="hidden", timeout=30_000)
        page.locator("#operation").get_by_text("inpaint", exact=True).click()
        page.locator("#photo-prompt textarea").wait_for(state="visible", timeout=30_000)
        assert page.locator("#photo-prompt textarea").input_value() == ""  # emptied while hidden: what runs is shown
        no_errors(page)


def test_a_filled_form_labels_guidance_for_its_model(weights, tmp_path, monkeypatch):
    """Issue 51 item 8: after a text model's "try these" row or "use these settings" on its result, the guidance
    slider still read "(with a class) … needs a class"; picking the model said "(with a prompt)". Both now set the
    label as picking does (the value the row's or the result's)."""
    monkeypatch.setenv("GRADIO_TEMP_DIR", str(tmp_path))
    page = app_page(weights)
    sample = page.tab(SampleTab)
    picked = page.form.model_form("words")[1]
    *_, last = sample.generate("words", "ddim", 2, 3, 1, "(any)", 2.0, 0.0, 1.0, "(the model's)", 0.0, "", "", "red apple", "")
    restored = dict(zip(SETTINGS_FORM, page.form.use_settings(last[sample.gallery], 0)))["guidance_scale"]
    filled = page.form.filled_form("words", "(any)")[1]
    for update in (restored, filled):
        assert update["label"] == picked["label"] == "guidance (with a prompt)"
        assert update["info"] == picked["info"] and "needs a prompt" in update["info"]
    assert restored["value"] == 2.0 and "value" not in filled  # the result's scale; the row's stays as it set it
    assert page.form.filled_form("tiny-classes", "(any)")[1]["label"] == "guidance (with a class)"


def _edit_cfg_is(page, value: str) -> None:
    page.wait_for_function("v => document.querySelector('#photo-cfg input[type=number]').value === v", arg=value,
                           timeout=30_000)


def test_browser_a_pasted_prompt_sets_the_photo_guidance_and_clearing_it_sets_1(server):
    """Issue 51 item 9: on the Photo tab a pasted prompt (or one filled in by a program) left the guidance at 1, so
    the run and its PNG used 1; typed key by key it set the model's scale; a cleared box kept that scale, though a
    run without a prompt needs 1 (docs/app.md)."""
    with browser_page(server) as page:
        page.get_by_role("tab", name="Photo").click()
        page.locator("#photo-model input").click()
        page.locator("#photo-model").get_by_role("option", name="words").click()
        page.locator("#operation").get_by_text("inpaint", exact=True).click()
        box = page.locator("#photo-prompt textarea")
        box.wait_for(state="visible", timeout=30_000)
        box.fill("red apple")  # at once, as a paste does
        _edit_cfg_is(page, "2.5")
        box.fill("")
        _edit_cfg_is(page, "1")
        # a paste: the clipboard's text arrives in one input event
        box.focus()
        page.evaluate("""() => { const t = document.querySelector('#photo-prompt textarea');
            t.value = 'blue car'; t.dispatchEvent(new Event('input', {bubbles: true})); }""")
        _edit_cfg_is(page, "2.5")
        box.press("Control+a")
        box.press("Delete")
        _edit_cfg_is(page, "1")
        no_errors(page)


def test_browser_a_prompt_stays_through_a_switch_to_a_class_model_and_back(server, tmp_path):
    """Issue 51 item 10: type "blue car" on a text model, switch to a class model and back: the prompt was gone. A
    class model's run between takes no prompt (its PNG has none)."""
    with browser_page(server) as page:
        page.locator("#model input").click()
        page.locator("#model").get_by_role("option", name="words").click()
        box = page.locator("#prompt textarea")
        box.wait_for(state="visible", timeout=30_000)
        box.fill("blue car")
        page.locator("#model input").click()
        page.locator("#model").get_by_role("option", name="tiny-classes").click()
        box.wait_for(state="hidden", timeout=30_000)
        page.locator("#steps input[type=number]").fill("2")
        page.locator("#steps input[type=number]").press("Enter")
        page.locator("#generate").click()
        page.locator("#status").get_by_text("done:").wait_for(timeout=60_000)
        src = page.locator("#gallery img").first.get_attribute("src")
        (tmp_path / "class.png").write_bytes(httpx.get(src, timeout=30).content)
        assert "prompt" not in read_settings(tmp_path / "class.png")
        page.locator("#model input").click()
        page.locator("#model").get_by_role("option", name="words").click()
        box.wait_for(state="visible", timeout=30_000)
        assert box.input_value() == "blue car"
        no_errors(page)


def test_a_cut_prompt_says_so_on_the_status_line_and_the_word_list(weights, tmp_path, monkeypatch):
    """Issue 51 item 5: a prompt longer than the tokenizer's max_length was cut and only the server log said so; the
    status quoted the whole prompt and the Attention tab quietly listed the words read. Both now say it was cut and
    which words were not read (Plan.words: what the model reads; the tokenizer's dropped: the rest)."""
    monkeypatch.setenv("GRADIO_TEMP_DIR", str(tmp_path))
    page = app_page(weights)
    sample, views = page.tab(SampleTab), page.tab(AttentionTab)
    max_length = TEXT["max_length"]  # the test tokenizer's (tests/model/test_text.py)
    prompt = " ".join(f"w{i}" for i in range(max_length + 3))
    *_, last = sample.generate("words", "ddim", 2, 0, 1, "(any)", 2.5, 0.0, 1.0, "(the model's)", 0.0, "", "", prompt, "")
    gen, status, words = last[page.generation], last[sample.status], last[views.words]
    assert gen.words == tuple(prompt.split()[:max_length]) and gen.unread == tuple(prompt.split()[max_length:])
    said = f"only the first {max_length} words; 3 more not read"
    assert said in status and f"w{max_length + 2}" in status, status
    assert said in words["label"] and len(words["choices"]) == max_length
    *_, whole = sample.generate("words", "ddim", 2, 0, 1, "(any)", 2.5, 0.0, 1.0, "(the model's)", 0.0, "", "", "red apple", "")
    assert "cut" not in whole[sample.status] and whole[views.words]["label"] == "the prompt's words"


def test_examples_are_the_model_folders_prompts(weights, tmp_path, monkeypatch):
    """A text model's "try these" row and example prompts are its sampling.json's example_prompts (chosen by prompt
    fidelity), PROMPTS only where it names none; they were PROMPTS for every model ("rocket" drew people)."""
    import json
    import shutil

    from denoiser.app.form import PROMPTS

    monkeypatch.setenv("GRADIO_TEMP_DIR", str(tmp_path))
    root = tmp_path / "weights"
    shutil.copytree(weights / "words", root / "own-prompts")
    shutil.copytree(weights / "words", root / "no-prompts")
    (root / "no-prompts" / "sampling.json").write_text(json.dumps({"guidance_scale": 2.5}))
    own = ["red apple", "yellow star", "blue car"]
    (root / "own-prompts" / "sampling.json").write_text(json.dumps({"guidance_scale": 2.5, "example_prompts": own}))
    form = ModelForm(Engine(root))
    assert [form.example_row("own-prompts", k)[-1] for k in range(4)] == [*own, own[0]]
    assert form.example_prompts("own-prompts") == tuple(own)
    assert form.text_controls("own-prompts")[3]["samples"] == [[p] for p in own]
    assert form.example_row("no-prompts", 1)[-1] == PROMPTS[1]  # a folder without them: the app's
    assert form.text_controls("no-prompts")[3]["samples"] == [[p] for p in PROMPTS]


@pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="make test installs Debian's chromium")
def test_browser_on_a_phone_the_prompt_sits_under_generate_and_the_tables_fit(server, tmp_path):
    """Issue 51 item 12 for a text model: at 390x844 its prompt and example prompts come right under Generate and its
    status (as a class model's class does: tests/app/test_sample.py), and the tables fit the width."""
    from playwright.sync_api import expect

    with browser_page(server, height=844, width=390) as page:
        page.locator("#model input").click()
        page.locator("#model").get_by_role("option", name="words").click()
        page.locator("#prompt textarea").wait_for(state="visible", timeout=30_000)
        page.locator("#class").wait_for(state="hidden", timeout=30_000)
        top = {sel: page.locator(sel).bounding_box()["y"] for sel in ("#generate", "#status", "#prompt",
                                                                      "#prompt-examples", "#preview", "#model")}
        page.screenshot(path=str(screenshots(tmp_path) / "app-phone-prompt.png"), full_page=True)
        assert top["#generate"] < top["#status"] < top["#prompt"] < top["#prompt-examples"] < top["#preview"], top
        assert top["#prompt"] - top["#status"] < 150 and top["#preview"] < top["#model"], top
        # the model's own example prompts, and a click on one types it (not the app's prompt at that place)
        page.locator("#prompt-examples").get_by_text(WORDS_EXAMPLES[1], exact=True).click()
        expect(page.locator("#prompt textarea")).to_have_value(WORDS_EXAMPLES[1], timeout=10_000)
        for table in ("#prompt-examples", "#try-these table"):
            box = page.locator(table).bounding_box()
            assert box["x"] >= 0 and box["x"] + box["width"] <= 390 - 16, (table, box)


def test_words_the_model_never_saw_are_said_on_the_status_line_and_the_word_list(weights, tmp_path, monkeypatch, caplog):
    """Issue 51 item 6: "日本" or an invented word got images and confident maps with no hint. A model folder that keeps
    its captions' words (tokenizer/vocabulary.txt) has them named where the prompt is shown."""
    import shutil

    from denoiser.model.text import WordHashTokenizer

    monkeypatch.setenv("GRADIO_TEMP_DIR", str(tmp_path))
    root = tmp_path / "w"
    shutil.copytree(weights / "words", root / "words")
    tokenizer = WordHashTokenizer.from_pretrained(root / "words" / "tokenizer")
    WordHashTokenizer(**tokenizer.config, vocabulary=["a red apple", "a blue car"]).save_pretrained(root / "words" / "tokenizer")
    page = app_page(root)
    sample, views = page.tab(SampleTab), page.tab(AttentionTab)
    # issue 60 item 7: said under the form while the prompt is typed, and logged once per Generate, not per keystroke
    caplog.set_level(logging.WARNING)
    for typed in ("red", "red 日本", "red 日本 zorb", "red 日本 zorblat"):
        note = page.form.budget_note("words", 2, 1, "(any)", 2.5, prompt=typed)
    assert note.startswith("work: ") and "never seen in training, drawn as a guess: “日本 zorblat”" in note
    assert not [r for r in caplog.records if "never seen in training" in r.getMessage()]
    *_, last = sample.generate("words", "ddim", 2, 0, 1, "(any)", 2.5, 0.0, 1.0, "(the model's)", 0.0, "", "", "red 日本 zorblat", "")
    gen, status, words = last[page.generation], last[sample.status], last[views.words]
    assert gen.unseen == ("日本", "zorblat")
    assert "never seen in training, drawn as a guess: “日本 zorblat”" in status and "日本 zorblat" in words["label"]
    assert len([r for r in caplog.records if "never seen in training" in r.getMessage()]) == 1  # one Generate, one line
    *_, known = sample.generate("words", "ddim", 2, 0, 1, "(any)", 2.5, 0.0, 1.0, "(the model's)", 0.0, "", "", "red apple", "")
    assert "never seen" not in known[sample.status] and known[views.words]["label"] == "the prompt's words"



def test_a_prompt_whose_marks_the_tokenizer_drops_is_said_as_it_is_read(weights, tmp_path, monkeypatch):
    """Issue 60 item 9: "赤いりんご" was shown as "赤いりんこ" with no word why (the tokenizer's NFKD folding drops the
    dakuten, as it drops "é"'s accent). The status line, the note under the form and the run's log now say so."""
    from denoiser.request import SampleRequest
    from denoiser.sampling.plan import resolve

    monkeypatch.setenv("GRADIO_TEMP_DIR", str(tmp_path))
    page = app_page(weights)
    sample = page.tab(SampleTab)
    note = page.form.budget_note("words", 2, 1, "(any)", 2.5, prompt="赤いりんご")
    assert "read as “赤いりんこ”: the tokenizer drops accents and marks" in note
    assert "read as" not in page.form.budget_note("words", 2, 1, "(any)", 2.5, prompt="red apple")
    *_, last = sample.generate("words", "ddim", 2, 0, 1, "(any)", 2.5, 0.0, 1.0, "(the model's)", 0.0, "", "", "café", "")
    assert "read as “cafe”: the tokenizer drops accents and marks" in last[sample.status]
    plan = resolve(SampleRequest(num_images=1, prompts="赤いりんご", steps=1), weights / "words")
    assert any("read as “赤いりんこ”" in n for n in plan.log_notes())

"""The app with weighted prompts and prompt-to-prompt (issue 53): the Sample tab's word edit ("change the words, keep
the picture") runs the core's edit from the selected result's noise, its PNGs carry the edit and "use these settings"
restores it; a weighted word's map is labelled with its weight; a malformed weight is a message before any work."""

from __future__ import annotations

import logging
from pathlib import Path

import gradio as gr
import httpx
import pytest
import torch

from denoiser.app.attention_tab import AttentionTab, image_words
from denoiser.app.form import SETTINGS_FORM
from denoiser.app.photo_tab import PhotoTab
from denoiser.app.png_settings import read_settings
from denoiser.app.sample_tab import SampleTab
from denoiser.app.word_edit import EDIT_SETTINGS, source_of
from denoiser.request import DEFAULT_CROSS_REPLACE, DEFAULT_SELF_REPLACE, GuidanceRequest, PromptEdit, SampleRequest
from denoiser.sampling.plan import resolve, run
from tests.app.browser import CHROMIUM, browser_page, click_result, no_errors, screenshots, type_number
from tests.app.test_text import weights  # noqa: F401 - the tiny text model "words" and a class model
from tests.conftest import app_page

FORM = ("(any)", 2.5, 0.0, 1.0, "(the model's)", 0.0, "", "")  # class .. pag layers, as Generate reads them


def _generate(sample: SampleTab, prompt: str, seed: int = 3, num_images: int = 3) -> dict:
    *_, last = sample.generate("words", "ddim", 3, seed, num_images, *FORM, prompt, "")
    return last


@pytest.fixture
def handlers(weights, tmp_path, monkeypatch):  # noqa: F811
    """The Sample tab of a built page (its handlers' updates are keyed by its components) and its word edit."""
    monkeypatch.setenv("GRADIO_TEMP_DIR", str(tmp_path))
    sample = app_page(weights).tab(SampleTab)
    return sample, sample.word_edit


def test_the_word_edit_is_the_cores_edit_from_the_selected_results_noise(handlers, weights):  # noqa: F811
    h, w = handlers
    first = _generate(h, "red apple")
    gallery = first[h.gallery]
    out = list(w.edit(gallery, 2, "blue apple", "replace", 0.6, 0.3))[-1]
    assert set(out) == set(h.outputs)  # done: every output of Generate set
    files, gen, status = out[h.gallery], out[h.page.generation], out[h.status]
    edit = PromptEdit("replace", cross_replace_steps=0.6, self_replace_steps=0.3)
    plan = resolve(SampleRequest(num_images=2, prompts=["red apple", "blue apple"], seed=5, scheduler="ddim", steps=3,
                                 guidance=GuidanceRequest(guidance_scale=2.5), edit=edit), weights / "words")
    assert torch.equal(gen.images, run(plan).images)  # seed 3 + result 3's index 2: its noise
    # the source is the picture kept: the same noise and steps, computed in a batch beside its edit (another GEMM
    # shape), so float32 rounding apart (1.26e-5 seen on a Zen 5) and no more
    torch.testing.assert_close(gen.images[0], first[h.page.generation].images[2], atol=5e-5, rtol=0)
    assert len(files) == 2 and status.startswith("done: 2 image(s) of “red apple” → “blue apple”, 3 steps")
    assert "replace" in status and "60%" in status and "30%" in status and "seed 5" in status
    for k, f in enumerate(files):
        s = read_settings(f)
        assert (s["prompt"], s["edit_prompt"], s["edit_type"]) == ("red apple", "blue apple", "replace")
        assert (s["cross_replace_steps"], s["self_replace_steps"], s["seed"], s["num_images"]) == (0.6, 0.3, 5, 2)
        assert (s["index"], s["count"]) == (k, 2) and source_of(s) == (5, "red apple")
    assert gen.image_words == (("red", "apple"), ("blue", "apple"))
    assert image_words(gen, 1, 0)["choices"] == [("blue", 0), ("apple", 1)]
    # editing an edit's picture starts again from its source: the same seed, the same source prompt
    again = list(w.edit(files, 1, "green apple", "replace", 0.6, 0.3))[-1]
    assert torch.equal(again[h.page.generation].images[0], gen.images[0]) and read_settings(again[h.gallery][0])["seed"] == 5


def test_use_these_settings_rebuilds_a_word_edit(handlers):
    h, w = handlers
    gallery = _generate(h, "red apple")[h.gallery]
    files = list(w.edit(gallery, 0, "red apple tree", "refine", 0.5, 0.2))[-1][h.gallery]
    out = w.use_settings(files, 1)
    form = dict(zip(SETTINGS_FORM, out))
    panel = dict(zip(EDIT_SETTINGS, out[len(SETTINGS_FORM):]))
    assert form["prompt"]["value"] == "red apple" and form["seed"]["value"] == 3 and form["num_images"]["value"] == 2
    assert {k: u["value"] for k, u in panel.items()} == {"edit_prompt": "red apple tree", "edit_type": "refine",
                                                          "cross_replace_steps": 0.5, "self_replace_steps": 0.2}
    assert out[-2] == "red apple" and out[-1].startswith("settings of ")  # the prompt the panel edits; the status line
    plain = w.use_settings(gallery, 0)  # a plain result leaves the panel as it is
    assert list(plain[len(SETTINGS_FORM):-1]) == [gr.skip()] * (len(EDIT_SETTINGS) + 1)


def test_the_panel_follows_the_selected_result(handlers):
    h, w = handlers
    gallery = _generate(h, "red apple")[h.gallery]
    selected, box, line, prompt, filled = w.new_results(gallery, None)
    assert selected == 0 and box["visible"] and prompt["value"] == "red apple" and filled == "red apple"
    assert "result 1 of 3" in line and "seed 3" in line
    _, line, prompt, _ = w.shown(gallery, 2, "red apple")
    assert "result 3 of 3" in line and "seed 5" in line and prompt.get("__type__") == "update" and "value" not in prompt
    files = list(w.edit(gallery, 0, "blue apple", "replace", 0.8, 0.4))[-1][h.gallery]
    _, _, _, prompt, _ = w.new_results(files, "red apple")  # its own results keep what was typed
    assert "value" not in prompt
    cls = h.generate("tiny-classes", "ddim", 2, 0, 1, "(any)", 1.0, 0.0, 1.0, "(the model's)", 0.0, "", "", "", "")
    assert not w.new_results(list(cls)[-1][h.gallery], None)[1]["visible"]  # a class model's result: no word edit


@pytest.mark.parametrize("edit_prompt, edit_type, expected", [
    ("red apple", "replace", "the edited prompt is the result's own"),
    ("", "replace", "type the edited prompt"),
    ("big red apple", "replace", 'edit_type "replace" swaps words one for one'),
    ("blue apple", "reweight", "the edit type must be one of replace, refine"),
    ("blue (apple:x)", "replace", "prompt weighting, at character 13"),
])
def test_a_word_edit_refused_before_any_work_says_why(handlers, edit_prompt, edit_type, expected):
    h, w = handlers
    gallery = _generate(h, "red apple", num_images=1)[h.gallery]
    runs = w.edit(gallery, 0, edit_prompt, edit_type, 0.8, 0.4)
    first = next(runs)
    assert first[h.status].startswith("**not started**:") and expected in first[h.status]
    assert list(first) == [h.status]  # nothing else changes
    with pytest.raises(Exception, match="."):
        next(runs)
    none = next(w.edit([], 0, "blue apple", "replace", 0.8, 0.4))
    assert "generate first" in none[h.status]


def test_a_weighted_word_is_labelled_with_its_weight(handlers):
    h, _ = handlers
    last = _generate(h, "(red:1.5) apple", num_images=1)
    views = h.page.tab(AttentionTab)
    gen = last[h.page.generation]
    assert gen.words == ("red", "apple") and gen.word_weights == ((1.5, 1.0),)  # the parsed words, not "1", "5"
    words = last[views.words]
    assert words["choices"] == [("red ×1.5", 0), ("apple", 1)]
    maps, chart = views.word_views(gen, 0, 1, (2, 3), 0)
    assert "the map of “red ×1.5”:" in maps["label"]
    assert "plus what the weights add" in chart["label"]
    plain, _ = views.word_views(gen, 0, 1, None, 1)
    assert "“apple”:" in plain["label"]
    assert read_settings(last[h.gallery][0])["prompt"] == "(red:1.5) apple"


def test_a_malformed_weight_is_refused_before_any_work(handlers, caplog):
    h, _ = handlers
    caplog.set_level(logging.INFO, logger="denoiser.app")
    runs = h.generate("words", "ddim", 3, 0, 1, *FORM, "(red:x) apple", "")
    first = next(runs)
    assert first[h.status].startswith("**not started**: prompt weighting, at character 6")
    assert "is not a number" in first[h.status] and list(first) == [h.status]
    with pytest.raises(Exception, match="prompt weighting"):
        next(runs)
    e = h.page.tab(PhotoTab)
    editor = {"background": None, "layers": [], "composite": None}
    edit = e.run_photo("words", "(any)", 2.5, editor, "edit", 0.0, 0.5, 0.0, 3, 0, prompt="red (apple")
    assert "not started**: prompt weighting" in next(edit)[e.status]  # before the photo is even looked at
    assert h.page.form.budget_note("words", 3, 1, "(any)", prompt="(red:x) apple") == ""  # Generate says why
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]  # no traceback logged


def test_a_word_edits_layers_are_not_switched_off(handlers):
    h, w = handlers
    gallery = _generate(h, "red apple", num_images=1)[h.gallery]
    gen = list(w.edit(gallery, 0, "blue apple", "replace", 0.8, 0.4))[-1][h.page.generation]
    with pytest.raises(ValueError, match="a word edit's layers cannot be switched off"):
        h.engine.views.ablate(gen, ["mid_attn"])


def _form(page, steps: int, images: int) -> None:
    """The steps and number of images typed, and held by their boxes (what Generate sends) before going on."""
    type_number(page, "steps", steps)
    type_number(page, "num-images", images)
    page.locator("#budget").get_by_text("work:").wait_for(timeout=30_000)


def _settings(page, tmp_path: Path, k: int) -> dict:
    src = page.locator("#gallery img").nth(k).get_attribute("src")
    (tmp_path / f"r{k}.png").write_bytes(httpx.get(src, timeout=30).content)
    return read_settings(tmp_path / f"r{k}.png")


def _generate_words(page, prompt: str, steps: int, images: int) -> None:
    """Pick the tiny text model "words", type `prompt`, generate, and wait for the run to finish."""
    page.locator("#model input").click()
    page.locator("#model").get_by_role("option", name="words").click()
    page.locator("#class").wait_for(state="hidden", timeout=30_000)
    page.locator("#prompt textarea").fill(prompt)
    _form(page, steps=steps, images=images)
    page.locator("#generate").click()
    page.locator("#status").get_by_text("done:").wait_for(timeout=120_000)


@pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="make test installs Debian's chromium")
def test_browser_change_the_words_keep_the_picture(server, tmp_path):
    """Generate a prompt, change its words: the gallery shows source and edit, their PNGs carry the edit, and "use
    these settings" on the edit brings the source prompt, the edited prompt and the fractions back."""
    shots = screenshots(tmp_path)
    with browser_page(server) as page:
        _generate_words(page, "red apple", steps=3, images=2)
        page.locator("#word-edit-prompt textarea").wait_for(state="visible", timeout=30_000)
        page.wait_for_function("() => document.querySelector('#word-edit-prompt textarea').value === 'red apple'",
                               timeout=30_000)  # filled with the result's prompt
        assert page.locator("#cross-replace input[type=number]").input_value() == str(DEFAULT_CROSS_REPLACE)
        assert page.locator("#self-replace input[type=number]").input_value() == str(DEFAULT_SELF_REPLACE)
        click_result(page, "gallery", 1)  # the second result is the one edited
        page.locator("#word-edit-source").get_by_text("result 2 of 2").wait_for(timeout=30_000)
        page.locator("#word-edit-prompt textarea").fill("blue apple")
        page.locator("#cross-replace input[type=number]").fill("0.6")
        page.locator("#cross-replace input[type=number]").press("Enter")
        page.locator("#word-edit-run").click()
        page.locator("#status").get_by_text("→ “blue apple”").wait_for(timeout=120_000)
        assert page.locator("#status").inner_text().startswith("done: 2 image(s) of “red apple” → “blue apple”, 3 steps")
        page.wait_for_function("() => document.querySelectorAll('#gallery button.thumbnail-item').length === 2",
                               timeout=30_000)
        page.wait_for_function("() => document.querySelector('#seed input').value === '1'", timeout=30_000)
        made = [_settings(page, tmp_path, k) for k in range(2)]
        assert all((s["prompt"], s["edit_prompt"], s["cross_replace_steps"], s["self_replace_steps"], s["seed"])
                   == ("red apple", "blue apple", 0.6, DEFAULT_SELF_REPLACE, 1) for s in made)  # result 2: seed 0 + 1
        page.wait_for_timeout(500)
        page.screenshot(path=str(shots / "word-edit-test.png"), full_page=True)
        # the form changed, then the edit's settings back from its PNG
        page.locator("#prompt textarea").fill("cat")
        page.locator("#word-edit-prompt textarea").fill("zzz")
        page.locator("#word-edit-type").get_by_text("refine", exact=True).click()
        click_result(page, "gallery", 1)
        page.locator("#use-settings").click()
        page.locator("#status").get_by_text("restored").wait_for(timeout=30_000)
        assert page.locator("#prompt textarea").input_value() == "red apple"
        assert page.locator("#word-edit-prompt textarea").input_value() == "blue apple"
        assert page.locator("#word-edit-type input[value=replace]").is_checked()
        assert page.locator("#cross-replace input[type=number]").input_value() == "0.6"
        assert page.locator("#seed input").input_value() == "1"
        no_errors(page)
        page.set_viewport_size({"width": 390, "height": 844})
        page.locator("#word-edit").scroll_into_view_if_needed()
        page.wait_for_timeout(500)
        page.screenshot(path=str(shots / "word-edit-test-phone.png"), full_page=True)
        page.set_viewport_size({"width": 1280, "height": 900})
        # the Attention tab: each picture's own words (the source's, then the edit's)
        page.get_by_role("tab", name="Attention").click()
        words = page.locator("#words label")
        words.first.wait_for(timeout=30_000)
        assert [t.strip() for t in words.all_inner_texts()] == ["red", "apple"]
        page.locator("#image-index input[type=number]").fill("1")
        page.locator("#image-index input[type=number]").press("Enter")
        page.wait_for_function("() => [...document.querySelectorAll('#words label')].map(l => l.innerText.trim()).join() "
                               "=== 'blue,apple'", timeout=30_000)
        page.locator("#words").get_by_text("blue", exact=True).click()
        page.locator("#word-maps").get_by_text("the map of “blue”").wait_for(timeout=60_000)
        no_errors(page)


@pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="make test installs Debian's chromium")
def test_browser_a_weighted_word_and_a_malformed_weight(server, tmp_path):
    """"(red:1.5) apple": the Attention tab's word and its map are labelled "red ×1.5"; "(red:x) apple": the status line
    says where the weight is wrong, and nothing runs (the gallery keeps its results)."""
    with browser_page(server) as page:
        _generate_words(page, "(red:1.5) apple", steps=2, images=1)
        assert page.locator("#status").inner_text().startswith("done: 1 image(s) of “(red:1.5) apple”, 2 steps")
        shown = page.locator("#gallery img").first.get_attribute("src")
        page.get_by_role("tab", name="Attention").click()
        words = page.locator("#words label")
        words.first.wait_for(timeout=30_000)
        assert [t.strip() for t in words.all_inner_texts()] == ["red ×1.5", "apple"]
        page.locator("#words").get_by_text("red ×1.5").click()
        page.locator("#word-maps img").wait_for(timeout=60_000)
        page.locator("#word-maps").get_by_text("the map of “red ×1.5”").wait_for(timeout=30_000)
        page.screenshot(path=str(screenshots(tmp_path) / "weighted-word-test.png"), full_page=True)
        no_errors(page)
        # issue 60 item 8: on a phone the chart's label sat over its first row of names; now it sits above the picture
        page.set_viewport_size({"width": 390, "height": 844})
        page.wait_for_timeout(500)
        label = page.locator("#word-maps [data-testid=block-label]").bounding_box()
        picture = page.locator("#word-maps img").bounding_box()
        assert label["y"] + label["height"] <= picture["y"] + 1, (label, picture)
        page.screenshot(path=str(screenshots(tmp_path) / "weighted-word-phone-test.png"), full_page=True)
        page.set_viewport_size({"width": 1280, "height": 900})
        page.get_by_role("tab", name="Sample").click()
        page.locator("#prompt textarea").fill("(red:x) apple")
        page.locator("#generate").click()
        page.locator("#status").get_by_text("not started").wait_for(timeout=60_000)
        status = page.locator("#status").inner_text()
        assert "prompt weighting, at character 6" in status and "is not a number" in status
        assert page.locator("#gallery img").first.get_attribute("src") == shown  # nothing ran
        assert "prompt weighting" in page.locator(".toast-body").first.inner_text()  # the refusal's toast too
        page.locator(".toast-close").first.click()
        page.locator(".toast-body").first.wait_for(state="hidden", timeout=10_000)
        no_errors(page)


def test_a_png_this_app_made_gives_its_settings_back_on_either_tab(handlers, tmp_path):
    """Issue 60 item 2 (A1111's PNG Info): a result PNG dropped on the Sample tab fills the form with what made it, a
    word edit's panel included; uploaded on the Photo tab before any run, "use these settings" reads it (it answered
    "run first"); a PNG from elsewhere is a picture, said in words."""
    from PIL import Image

    h, w = handlers
    first = _generate(h, "(red:1.5) apple", seed=7, num_images=2)
    made = first[h.gallery][1]  # the second result's PNG
    out = w.settings_of_file(made)
    values = dict(zip(SETTINGS_FORM, out[: len(SETTINGS_FORM)]))
    assert values["seed"]["value"] == 7 and values["prompt"]["value"] == "(red:1.5) apple"
    assert values["model"]["value"] == "words" and out[-1].startswith("settings of `") and "restored" in out[-1]
    plain = tmp_path / "holiday.png"
    Image.new("RGB", (20, 20), (10, 200, 30)).save(plain)
    said = w.settings_of_file(str(plain))
    assert said[-1] == "`holiday.png` carries no settings of this app: it is a picture (the Photo tab denoises and edits it)"
    assert all(isinstance(o, type(gr.skip())) for o in said[:-1])
    e = h.page.tab(PhotoTab)
    restored = e.restore_form([], 0, {"source": made, "copy": made})
    assert restored[-2].startswith("settings of `") and "restored: press Run" in restored[-2]
    assert restored[-1] == "(red:1.5) apple"  # the prompt it filled
    nothing = e.restore_form([], 0, {"source": str(plain), "copy": str(plain)})
    assert nothing[-2] == "run first, or upload a PNG this app made: the settings are read from a result"
    text = e.load_photo(made, None, "words")[1]
    assert "This PNG was made by this app" in text and "made by" not in e.load_photo(str(plain), None, "words")[1]


def test_a_png_of_the_other_tab_or_a_file_that_is_no_png_fills_nothing_and_says_why(handlers, tmp_path):
    """Issue 72 findings 3 and 5: a Photo tab result dropped on the Sample tab said "settings … restored: press
    Generate" and emptied the scheduler and images boxes (Generate then drew 8 unconditional images at defaults); a
    text file renamed .png was "a picture" the Photo tab denoises. Each now leaves the form as it was and says why."""
    from PIL import Image

    from denoiser.app.png_settings import save_with_settings

    h, w = handlers
    photo_made = {"model": "words", "operation": "denoise", "sigma": 0.0, "sigma_removed": 0.05, "add_noise": 0.0,
                  "chain": False, "seed": 0, "steps": 50, "guidance_scale": 1.0, "pag_scale": 0.0, "size": [20, 20]}
    photo_png = save_with_settings(Image.new("RGB", (20, 20)), tmp_path, photo_made)
    said = w.settings_of_file(str(photo_png))
    assert said[-1] == (f"`{photo_png.name}` is a Photo tab result: its settings fill the Photo tab's form (drop it "
                        "there); nothing here was changed")
    assert all(isinstance(o, type(gr.skip())) for o in said[:-1])  # the scheduler, images, ... keep their values
    text = tmp_path / "notes.png"
    text.write_text("shopping list: apples, pears\n")
    said = w.settings_of_file(str(text))
    assert said[-1].startswith("`notes.png` is not a picture: it could not be read as a PNG") and "a picture (" not in said[-1]
    assert all(isinstance(o, type(gr.skip())) for o in said[:-1])


def test_a_sample_result_on_the_photo_tab_says_it_is_one(handlers):
    """Issue 72 finding 3, the other way round: a Sample tab result uploaded on the Photo tab says which tab made it
    and what "use these settings" takes from it here (it said "fills the form with what made it")."""
    h, _ = handlers
    made = _generate(h, "red apple", seed=7, num_images=1)[h.gallery][0]
    note = h.page.tab(PhotoTab).load_photo(made, None, "words")[1]
    assert "made by this app on the Sample tab" in note and "fills the form with what made it" not in note

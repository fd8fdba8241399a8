"""The web app end to end: through gradio_client, and in a real headless Chromium (Playwright); app.py as
its own process for what only a whole process shows (its memory, its temp files, SIGTERM)."""

from __future__ import annotations

import logging
import re
import time
from pathlib import Path

import pytest
from PIL import Image

from denoiser.app import views
from denoiser.app.layout import CSS
from denoiser.fast.precision import choose_precision
from denoiser.folders.model_dir import WEIGHTS_DIR
from tests.app.browser import (
    BROWSER_ARGS,
    CHROMIUM,
    browser_page,
    browser_pages,
    click_result,
    screenshots,
    settled,
    wait_for_status,
)
from tests.app.browser import choose as _choose
from tests.app.browser import no_errors as _no_errors
from tests.app.test_serve import _assert_sampling_runs, _cpu_seconds_over, _sampling_threads


def test_click_maps_through_display_scaling():
    assert views.click_to_pixel((0, 0), 32) == (0, 0)
    assert views.click_to_pixel((255, 255), 32) == (31, 31)
    assert views.click_to_pixel((9, 200), 32, display=256) == (25, 1)  # (x, y) in, (y, x) out
    assert views.click_to_pixel((300, 300), 16) == (15, 15)


def test_gradio_client_samples_then_shows_attention(server):
    from gradio_client import Client

    client = Client(server, verbose=False)
    out = client.predict("tiny-classes", "ddim", 4, 1, 3, "1", api_name="/generate")
    grid_path, gallery = out[0], out[1]
    assert len(gallery) == 3
    assert Image.open(gallery[0]["image"]).size == (16, 16) and Image.open(gallery[0]["image"]).format == "PNG"
    # issue 35 item 14: each PNG is named after its settings and carries them
    from denoiser.app.png_settings import read_settings

    assert Path(gallery[2]["image"]).name == "tiny-classes-seed1-1-ddim4-3of3.png"
    assert read_settings(gallery[2]["image"]) == {"model": "tiny-classes", "seed": 1, "class": "1", "scheduler": "ddim",
                                                   "steps": 4, "num_images": 3, "guidance_scale": 1.0, "pag_scale": 0.0,
                                                   "guide_scale": 1.0, "index": 2, "count": 3,
                                                   "precision": choose_precision().name}  # what ran (issue 58)
    assert Image.open(grid_path).format == "PNG"
    y, x, _, maps, stages, text = client.predict(2, 3, 7, 9, 1, 1, api_name="/attention")
    assert (y, x) == (7, 9)
    assert Image.open(maps).width > 200 and Image.open(stages).width > 100
    assert "head 1" in text and "sum to 1.000000" in text
    # another session never sees this one's images
    other = Client(server, verbose=False)
    with pytest.raises(Exception, match="generate images first"):
        other.predict(0, 0, 1, 1, 0, 0, api_name="/attention")
    with pytest.raises(Exception, match="less than minimum value 1|steps must be a whole number in 1..1000"):
        client.predict("tiny-classes", "ddim", 0, 1, 1, "(any)", api_name="/generate")
    with pytest.raises(Exception, match="not in the list of choices|unknown model"):
        client.predict("../tiny-classes", "ddim", 2, 1, 1, "(any)", api_name="/generate")


def test_the_api_left_at_its_defaults_samples_the_models_own_as_the_cli_does(server, weights):
    """Issue 59 finding 3: the /generate API declared the page's first values as its defaults (DDIM-50, guidance 1),
    so a call naming only the model and a class ran unguided, where `denoiser sample` runs the folder's CFG. Each
    field left out is now the model's own: the same images as the core's request with the same fields unset."""
    import numpy as np
    import torch
    from gradio_client import Client

    from denoiser.app.png_settings import read_settings
    from denoiser.request import SampleRequest
    from denoiser.sampling.plan import resolve, run

    folder = weights / "synthetic-shapes"  # its sampling.json: CFG 2, PAG 0.5 (tests/app/browser.py)
    client = Client(server, verbose=False)
    declared = client.view_api(return_format="dict", print_info=False)["named_endpoints"]["/generate"]
    defaults = {p["parameter_name"]: p["parameter_default"] for p in declared["parameters"] if p["parameter_has_default"]}
    assert {name: defaults[name] for name in ("scheduler", "steps", "num_images", "guidance_scale", "pag_scale")} == dict.fromkeys(
        ("scheduler", "steps", "num_images", "guidance_scale", "pag_scale"))
    out = client.predict("synthetic-shapes", steps=3, class_name="circle", seed=4, api_name="/generate")
    files = [item["image"] for item in out[1]]
    core = run(resolve(SampleRequest(classes="circle", seed=4, steps=3), folder)).images  # as the CLI asks it
    pngs = torch.stack([torch.from_numpy(np.array(Image.open(f).convert("RGB"))).permute(2, 0, 1) for f in files])
    assert pngs.shape == core.shape  # BUILT_IN's number of images
    assert (pngs.int() - core.mul(255).round().int()).abs().max() <= 1
    settings = read_settings(files[0])
    assert (settings["guidance_scale"], settings["pag_scale"], settings["steps"]) == (2.0, 0.5, 3)  # what ran


def test_one_image_and_one_step_work_and_the_most_images_too(server):
    from gradio_client import Client

    client = Client(server, verbose=False)
    for steps, images in ((1, 1), (2, 1), (1, 2), (1, 64)):  # both ends of the image range
        out = client.predict("tiny-classes", "ddim", steps, 0, images, "(any)", api_name="/generate")
        assert len(out[1]) == images and Image.open(out[0]).format == "PNG"
        y, x, *_ = client.predict(0, steps - 1, 3, 4, 0, 0, api_name="/attention")
        assert (y, x) == (3, 4)


def test_every_view_follows_the_step_and_a_new_generation_clears_them(server):
    from gradio_client import Client

    client = Client(server, verbose=False)
    client.predict("tiny-classes", "ddim", 4, 0, 2, "(any)", api_name="/generate")
    _, _, _, maps_last, _, text_last = client.predict(1, 3, 5, 6, 0, 0, api_name="/attention")
    _, maps_first, _, text_first = client.predict(1, 1, 0, 0, api_name="/refresh")  # image 1, step 1
    assert "step 3" in text_last and "step 1" in text_first  # the stages follow the step ...
    assert Image.open(maps_first).tobytes() != Image.open(maps_last).tobytes()  # ... and so do the maps
    client.predict("tiny-classes", "ddim", 2, 1, 1, "(any)", api_name="/generate")
    clickable, maps, stages, text = client.predict(0, 1, 0, 0, api_name="/refresh")
    assert clickable is not None and maps is None and stages is None and text == ""  # the old pixel is gone


def test_failures_read_as_short_escaped_messages(server, weights, capfd, caplog):
    from gradio_client import Client

    caplog.set_level(logging.INFO, logger="denoiser.app")
    client = Client(server, verbose=False)
    for model, expected in (("bin-only", "no safetensors weights"), ("broken-config", "not valid JSON")):
        with pytest.raises(Exception) as info:
            client.predict(model, "ddim", 2, 0, 1, "(any)", api_name="/generate")
        message = str(info.value)
        assert expected in message and str(weights) not in message and "Traceback" not in message
    with pytest.raises(Exception) as info:
        client.predict("tiny-classes", "ddim", 2, 0, 1, "<b>x</b>" * 20_000, api_name="/generate")
    message = str(info.value)
    assert "is not one of this model's classes" in message and "<b>" not in message and len(message) < 600
    # the server's log: one line per user error, no traceback
    lines = [r.getMessage() for r in caplog.records if r.name == "denoiser.app"]
    assert sum("user error:" in line and "no safetensors weights" in line for line in lines) == 1
    assert sum("is not one of this model's classes" in line for line in lines) == 1
    assert "Traceback" not in capfd.readouterr().err
    with pytest.raises(Exception, match=r"seed must be a whole number in 0\.\.4294967295: the box is empty"):
        client.predict("tiny-classes", "ddim", 2, None, 1, "(any)", api_name="/generate")  # an emptied box: ours
    # issue 60 item 3: a decimal reaches the check as typed (Gradio's precision=0 ran steps 2.5 as 2, seed 2.5 as 2)
    for args, message in (((2.5, 0, 1), "steps must be a whole number in 1..1000, got 2.5"),
                          ((2, 2.5, 1), "seed must be a whole number in 0..4294967295, got 2.5"),
                          ((2, 0, 2.5), "number of images must be a whole number in 1..64, got 2.5")):
        with pytest.raises(Exception, match=re.escape(message)):
            client.predict("tiny-classes", "ddim", *args, "(any)", api_name="/generate")


def _click_on_attention_tab(page, fx: float, fy: float):
    """Open the Attention tab, click the image at fractions (fx, fy) of its size; the maps' locator."""
    page.get_by_role("tab", name="Attention").click()
    image = page.locator("#clickable img")
    image.wait_for(timeout=30_000)
    box = image.bounding_box()
    image.click(position={"x": box["width"] * fx, "y": box["height"] * fy})
    maps = page.locator("#maps img")
    maps.wait_for(timeout=30_000)
    return maps


@pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="make test installs Debian's chromium")
def test_browser_generate_click_and_see_heatmaps(server, tmp_path):
    shots = screenshots(tmp_path)
    with browser_page(server) as page:
        page.get_by_role("tab", name="Attention").click()
        assert page.get_by_text("denoising step").count() == 0  # no sliders before there is a generation
        page.get_by_role("tab", name="Sample").click()
        page.locator("#generate").click()
        page.locator("#gallery img").first.wait_for(timeout=120_000)
        page.wait_for_function("() => { const i = document.querySelector('#preview img'); return i && i.naturalWidth >= 200 }",
                               timeout=30_000)  # the preview is enlarged (nearest), not 16 px per tile
        page.screenshot(path=str(shots / "app-sample.png"), full_page=True)
        maps = _click_on_attention_tab(page, 0.4, 0.6)
        page.wait_for_function("() => { const i = document.querySelector('#maps img'); return i && i.naturalWidth > 0 }")
        assert page.locator("#stages img").count() == 1
        size = maps.evaluate("img => [img.naturalWidth, img.naturalHeight]")
        assert size[0] > 200 and size[1] > 100
        _other_layer_and_head_then_mean(page)
        page.screenshot(path=str(shots / "app-attention.png"), full_page=True)
        assert page.locator("#earlier img").count() == 0  # issue 41 item 14: the run's results are not shown twice
        # issue 35 item 14: the session's results outlive a reload (kept in the browser, as far as Gradio allows),
        # and "use these settings" reads them back
        page.reload()
        settled(page)  # the load event first: it would overwrite the settings read back before it
        page.locator("#earlier img").first.wait_for(timeout=30_000)
        assert page.locator("#earlier img").count() == 8  # the one run's 8 images
        click_result(page, "earlier", 2)
        page.locator("#use-earlier").click()
        page.locator("#status").get_by_text("-3of8.png restored: press Generate").wait_for(timeout=10_000)
    assert (shots / "app-attention.png").stat().st_size > 10_000


def _other_layer_and_head_then_mean(page) -> None:
    """Issue 35 items 1 and 2: another layer, then another of its heads (a selector of that layer's heads, not a
    free number), then the maps averaged over the steps: each view follows, without an error."""
    stage_text = page.locator("#stage-text")
    layer = _choose(page, "layer", 1)
    stage_text.get_by_text(f"{layer}, head 0").wait_for(timeout=30_000)  # the four stages of the new layer
    page.locator("#head input").click()
    page.locator("#head").get_by_role("option").first.wait_for(timeout=10_000)
    heads = [t.replace("✓", "").strip() for t in page.locator("#head").get_by_role("option").all_inner_texts()]
    assert heads == [str(i) for i in range(len(heads))] and len(heads) >= 2, heads  # only the layer's own heads
    head = heads[-1]
    page.locator("#head").get_by_role("option").nth(len(heads) - 1).click()
    stage_text.get_by_text(f"{layer}, head {head}").wait_for(timeout=30_000)
    before = page.locator("#maps img").get_attribute("src")
    page.locator("#mean-run").click()  # issue 41 item 7: a job with its progress line and Stop
    page.locator("#mean-status").get_by_text("averaged over all").wait_for(timeout=60_000)
    page.wait_for_function(f"() => document.querySelector('#maps img') && document.querySelector('#maps img').src !== {before!r}",
                           timeout=60_000)
    page.wait_for_timeout(500)
    _no_errors(page)
    assert page.locator("#stages img").count() == 1 and page.locator("#clickable img").count() == 1


@pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="make test installs Debian's chromium")
def test_no_errors_sees_a_shown_error_and_not_one_the_css_hides():
    """The check every browser test ends with: a red "Error" a person can see fails it; the pill layout.CSS hides
    (Gradio may put it on a status block after Stop) does not."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=BROWSER_ARGS)
        try:
            page = browser.new_page()
            page.set_content('<div id="status"><div data-testid="status-tracker"><span class="error">Error</span>'
                             f'</div></div><style>{CSS}</style>')
            _no_errors(page)
            page.set_content('<div id="status"><span class="error">Error</span></div>')
            with pytest.raises(AssertionError, match="an error is shown on \\['status'\\]"):
                _no_errors(page)
        finally:
            browser.close()


@pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="make test installs Debian's chromium")
def test_browser_progress_says_how_far_and_stop_frees_the_slot(server, tmp_path):
    shots = screenshots(tmp_path)
    with browser_page(server) as page:
        # issue 35 item 8: the budget shows beside the sliders before Generate
        page.locator("#num-images input[type=number]").fill("64")
        page.locator("#num-images input[type=number]").press("Enter")
        page.locator("#steps input[type=number]").fill("1000")
        page.locator("#steps input[type=number]").press("Enter")
        page.locator("#budget").get_by_text("over the work budget").wait_for(timeout=30_000)
        page.locator("#steps input[type=number]").fill("500")
        page.locator("#steps input[type=number]").press("Enter")
        page.locator("#num-images input[type=number]").fill("8")
        page.locator("#num-images input[type=number]").press("Enter")
        page.locator("#budget").get_by_text(re.compile(r"^work: [\d,]+ of [\d,]+ units$")).wait_for(timeout=30_000)
        page.locator("#generate").click()
        left = page.get_by_text(re.compile(r"denoising: step \d+ / 500 · about \d+ (s|min) left")).first
        left.wait_for(timeout=60_000)
        page.screenshot(path=str(shots / "app-progress.png"), full_page=True)
        _assert_sampling_runs(1.0)
        _together_on_screen(page, ["#generate", "#stop", "#status", "#preview"])  # issue 35 item 11, while it runs
        page.locator("#stop").click()
        tic = time.monotonic()
        while _sampling_threads() and time.monotonic() - tic < 10:
            time.sleep(0.05)
        stopped = time.monotonic() - tic
        assert stopped < 2, f"the work went on {stopped:.1f} s after Stop"
        assert _cpu_seconds_over(1.0) < 0.25, "the server still works after Stop"
        # issue 35 item 7: the status says where it stopped and what the pictures are, with no "Error" badge
        page.locator("#status").get_by_text(re.compile(r"stopped at step \d+ / 500")).wait_for(timeout=10_000)
        assert "not a result" in page.locator("#status").inner_text()
        page.wait_for_timeout(1000)
        _no_errors(page)
        page.locator("#steps input[type=number]").fill("3")
        page.locator("#steps input[type=number]").press("Enter")
        page.locator("#cfg input[type=number]").fill("3")  # not the model's own guidance: "use these settings" below
        page.locator("#cfg input[type=number]").press("Enter")
        generated_class = page.locator("#class input").input_value()
        page.locator("#generate").click()  # the slot is free: a short job runs at once
        page.locator("#gallery img").first.wait_for(timeout=30_000)
        # issue 35 item 12: settings that give noise say so
        page.locator("#status").get_by_text("only 3 step(s): the images are still mostly noise").wait_for(timeout=10_000)
        # issue 35 item 14: "use these settings" refills the form from the selected result's PNG
        page.locator("#steps input[type=number]").fill("9")
        page.locator("#steps input[type=number]").press("Enter")
        other = _choose(page, "class", 2) if generated_class not in ("", "(any)") else None  # resets the guidance
        click_result(page, "gallery", 0)
        page.locator("#use-settings").click()
        page.wait_for_function("() => document.querySelector('#steps input[type=number]').value === '3'", timeout=10_000)
        page.locator("#status").get_by_text("restored: press Generate").wait_for(timeout=10_000)
        # the whole form is the result's: the restored class does not reset the guidance to the model's own
        page.wait_for_timeout(1000)  # any listener the restore set off has run
        assert page.locator("#cfg input[type=number]").input_value() == "3"
        if other is not None:
            assert other != generated_class and page.locator("#class input").input_value() == generated_class
        gallery = page.locator("#gallery").bounding_box()  # issue 35 item 11: the gallery fits its row
        for img in page.locator("#gallery img").all():
            box = img.bounding_box()
            assert box["x"] >= gallery["x"] - 1 and box["x"] + box["width"] <= gallery["x"] + gallery["width"] + 1


def _together_on_screen(page, selectors: list[str]) -> None:
    """Each element lies wholly inside the viewport (no scrolling needed to see any of them)."""
    size = page.viewport_size
    for sel in selectors:
        box = page.locator(sel).bounding_box()
        assert box is not None, f"{sel} is not shown"
        assert box["y"] >= 0 and box["y"] + box["height"] <= size["height"], f"{sel} is off-screen: {box}"
        assert box["x"] >= 0 and box["x"] + box["width"] <= size["width"], f"{sel} is off-screen: {box}"


@pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="make test installs Debian's chromium")
def test_browser_on_a_phone_run_controls_and_preview_stay_together(server, tmp_path):
    """Issue 35 item 11 at 390x844: Generate, Stop and the preview on the first screen; the Photo tab's Run with its
    results."""
    with browser_page(server, height=844, width=390) as page:
        _together_on_screen(page, ["#generate", "#stop", "#preview"])
        page.screenshot(path=str(screenshots(tmp_path) / "app-phone-sample.png"))
        page.get_by_role("tab", name="Photo").click()
        page.locator("#photo-run").scroll_into_view_if_needed()
        run, results = page.locator("#photo-run").bounding_box(), page.locator("#photo-result").bounding_box()
        # between them only Stop, the status line (its height kept, issue 72) and the line saying what Run does: the
        # results start within a third of the phone's screen below Run
        assert 0 < results["y"] - run["y"] < 844 / 3, f"the results are far from Run: {run}, {results}"


@pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="make test installs Debian's chromium")
def test_browser_a_second_visitor_sees_the_queue_position(server):
    with browser_pages(server, 2, height=800) as (first, second):
        for page in (first, second):
            page.locator("#steps input[type=number]").fill("400")
            page.locator("#steps input[type=number]").press("Enter")
        first.locator("#generate").click()
        first.locator("#status").get_by_text("denoising: step").wait_for(timeout=60_000)
        second.locator("#generate").click()  # one sampling job at a time: this one waits
        second.locator("#status").get_by_text("waiting in the queue: 1 job ahead").wait_for(timeout=30_000)
        first.locator("#stop").click()
        second.locator("#status").get_by_text("denoising: step").wait_for(timeout=60_000)  # its turn came
        second.locator("#stop").click()


@pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="make test installs Debian's chromium")
def test_browser_examples_fill_the_settings_and_a_picture(server, demo, weights, tmp_path):
    from gradio.route_utils import delete_files_created_by_app

    from denoiser.app.engine import Engine

    shots = screenshots(tmp_path)
    with browser_page(server, height=1000) as page:
        page.locator("#steps input[type=number]").fill("7")
        rows = page.get_by_text("try these").locator("xpath=ancestor::div[contains(@class,'block')][1]").locator("tbody tr")
        rows.first.wait_for(timeout=30_000)
        assert rows.count() == 2  # the two models that load: the broken folders are not offered
        # issue 35 item 5: a class of the first model chosen, then a row of the other model: it sets its own class
        _choose(page, "class", 2)
        model, scheduler, steps = (rows.nth(1).locator("td").nth(k).inner_text().strip() for k in range(3))
        own = Engine(weights).defaults(model)  # the row samples at the model's measured best, as picking it does
        assert (scheduler, int(steps)) == (own.scheduler, own.steps)
        rows.nth(1).click()  # a row sets everything and generates (issue 35 item 10)
        page.wait_for_function(f"() => document.querySelector('#steps input[type=number]').value === '{steps}'",
                               timeout=10_000)
        page.locator("#status").get_by_text(re.compile(rf"done: 8 image\(s\) of class .+, {steps} steps")).wait_for(
            timeout=120_000)
        page.locator("#steps input[type=number]").fill("3")
        page.locator("#steps input[type=number]").press("Enter")
        page.locator("#generate").click()  # the failing step: Generate after the switch
        # timed out once in a fresh clone's make test here (stop 68): its failure says what the page showed
        wait_for_status(page, re.compile(r"done: 8 image\(s\) of class .+, 3 steps"), 60_000)
        _no_errors(page)
        # issue 35 item 4: Gradio's cache sweep (delete_cache) removes every file it made; the examples stay
        # (the run's keep_results may still be adding files: denoiser.app.cache_sweep keeps that from failing it)
        delete_files_created_by_app(demo, None)
        page.get_by_role("tab", name="Photo").click()
        page.get_by_text("try a picture").wait_for(timeout=30_000)
        examples = page.locator("#photo").locator("xpath=ancestor::div[contains(@class,'column')][1]")
        examples.locator(".gallery-item, tbody tr").first.click()  # cube.png, drawn for the project
        page.locator("#photo-text").get_by_text("your photo: 256x256").wait_for(timeout=30_000)
        page.locator("#photo-run").click()
        page.locator("#photo-status").get_by_text("done: denoise").wait_for(timeout=60_000)
        page.screenshot(path=str(shots / "app-photo-example.png"), full_page=True)
        gallery = page.locator("#photo-result").bounding_box()
        for img in page.locator("#photo-result img").all():  # nothing cut off: each picture inside the gallery
            box = img.bounding_box()
            assert box["y"] + box["height"] <= gallery["y"] + gallery["height"] + 1
            assert img.evaluate("i => getComputedStyle(i).imageRendering") == "pixelated"  # sharp model pixels
        page.get_by_role("tab", name="Attention").click()
        assert page.locator("#attention-hint").get_by_text("Generate on the Sample tab or run the Photo tab").count() == 1


@pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="make test installs Debian's chromium")
def test_browser_attention_guidance_then_heads_view_and_switching_a_layer_off(server, tmp_path):
    shots = screenshots(tmp_path)
    with browser_page(server) as page:
        pag = page.locator("#pag input[type=number]")
        if (WEIGHTS_DIR / "synthetic-shapes").is_dir():  # the default model: its sampling.json sets the sliders
            page.wait_for_function("() => { const i = document.querySelector('#pag input[type=number]'); "
                                   "return i && i.value === '0.5' }", timeout=30_000)
            # issue 35 item 10: a class is chosen, and the guidance is the model's (its sampling.json: 2)
            page.wait_for_function("() => document.querySelector('#cfg input[type=number]').value === '2'", timeout=30_000)
            assert page.locator("#class input").input_value() not in ("", "(any)")
        pag.fill("2")
        pag.press("Enter")
        assert page.locator("#autoguidance").is_hidden()  # no shipped guide: no autoguidance slider
        page.locator("#generate").click()
        page.locator("#gallery img").first.wait_for(timeout=120_000)
        page.get_by_role("tab", name="Heads").click()
        page.locator("#stats-run").click()
        page.wait_for_function("() => { const i = document.querySelector('#stats-chart img'); return i && i.naturalWidth >= 480 }",
                               timeout=120_000)
        assert "mid_attn" in page.locator("#stats-table").inner_text()  # the layers x heads table
        page.locator("#off-layers input").click()
        page.get_by_role("option", name="mid_attn").click()
        page.keyboard.press("Escape")
        page.locator("#off-run").click()
        page.get_by_text("switched to identity attention").wait_for(timeout=120_000)
        # the result: two rows (as generated, switched off) of all the images, wider than tall
        page.wait_for_function("() => { const i = document.querySelector('#off-image img'); "
                               "return i && i.naturalWidth > 2 * i.naturalHeight }", timeout=30_000)
        page.screenshot(path=str(shots / "app-heads.png"), full_page=True)
    assert (shots / "app-heads.png").stat().st_size > 10_000




def test_every_api_output_has_a_name(demo):
    """Issue 72 finding 7: /generate returned 15 outputs, some named value_128, value_130 (a component without a label):
    every output of every API door is named (what /info, and gradio_client's view_api, show)."""
    info = demo.get_api_info()
    unnamed = [(door, out["component"]) for door, endpoint in info["named_endpoints"].items()
               for out in endpoint["returns"] if re.fullmatch(r"value_\d+", str(out["label"]))]
    assert not unnamed, unnamed
    returns = [out["label"] for out in info["named_endpoints"]["/generate"]["returns"]]
    assert "status" in returns and len(set(returns)) == len(returns), returns


def test_the_photo_tabs_door_is_photo_and_edit_means_sdedit_alone(demo):
    """Issue 72 part 5: "edit" had four meanings. The Photo tab's door was /edit, its handler run_edit, its element ids
    edit-*. Its door is /photo (whose operations are denoise, sampled denoise, inpaint and edit, SDEdit alone), the
    word edit's /word_edit, and no element id of the page starts with edit-."""
    info = demo.get_api_info()
    doors = set(info["named_endpoints"])
    assert {"/generate", "/photo", "/word_edit"} <= doors and "/edit" not in doors, sorted(doors)
    photo = {p["parameter_name"]: p for p in info["named_endpoints"]["/photo"]["parameters"]}
    assert list(photo)[:5] == ["model", "class_name", "guidance_scale", "editor", "operation"], list(photo)
    ids = {block.elem_id for block in demo.blocks.values() if getattr(block, "elem_id", None)}
    assert not [i for i in ids if i.startswith("edit-")], sorted(i for i in ids if "edit" in i)
    assert {"photo-run", "photo-status", "photo-result", "photo-model", "word-edit-prompt", "word-edit-type"} <= ids


@pytest.mark.parametrize(("field", "value", "said"), [("model", "no-such-model", "no-such-model"),
                                                      ("scheduler", "no-such-scheduler", "no-such-scheduler")])
def test_an_api_call_naming_what_does_not_exist_logs_one_line(server, capfd, caplog, field, value, said):
    """Issue 72 finding 7: an API call naming a model that does not exist logged a whole Gradio traceback (its
    dropdown's own check) for a caller's mistake: it is refused by the app, in one line of the log."""
    from gradio_client import Client

    caplog.set_level(logging.INFO, logger="denoiser.app")
    capfd.readouterr()
    client = Client(server, verbose=False)
    with pytest.raises(Exception, match=said):
        client.predict(**{"model": "tiny-classes", "steps": 2, "num_images": 1, field: value}, api_name="/generate")
    lines = [r.getMessage() for r in caplog.records if r.name == "denoiser.app" and said in r.getMessage()]
    assert len(lines) == 1 and lines[0].startswith("user error:"), lines
    err = capfd.readouterr().err
    assert "Traceback" not in err and "gradio.exceptions.Error" not in err, err[-2000:]


def test_a_photo_api_call_naming_a_model_that_does_not_exist_logs_one_line(server, tmp_path, capfd, caplog):
    """Issue 72 finding 7 on the Photo tab's door: /edit (now /photo) with a model that does not exist logged Gradio's traceback
    (the page's model dropdown checked it); the app refuses it, in one line of the log."""
    from gradio_client import Client, handle_file

    image = tmp_path / "photo.png"
    Image.new("RGB", (32, 24), (30, 160, 60)).save(image)
    editor = {"background": handle_file(str(image)), "layers": [], "composite": handle_file(str(image)), "id": None}
    caplog.set_level(logging.INFO, logger="denoiser.app")
    capfd.readouterr()
    with pytest.raises(Exception, match="no-such-model"):
        Client(server, verbose=False).predict("no-such-model", "(any)", 1.0, editor, "denoise", 0.0, 0.3, 0.0, 1, 0,
                                              api_name="/photo")
    lines = [r.getMessage() for r in caplog.records if r.name == "denoiser.app" and "no-such-model" in r.getMessage()]
    assert len(lines) == 1 and lines[0].startswith("user error:"), lines
    err = capfd.readouterr().err
    assert "Traceback" not in err and "gradio.exceptions.Error" not in err, err[-2000:]

"""The Photo tab (denoiser/app/photo_tab.py): its handlers, and in a real headless Chromium the clicks of issue 41's
Edit items: Stop keeps the last results, uploads outlive Gradio's cache sweep, photos at their own size under a
megapixel limit shown before the upload, results that carry their settings, the σ estimated, the scope of Run said
before it runs."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from denoiser.app.engine import Engine
from denoiser.app.jobs import Jobs
from denoiser.app.page import Page
from denoiser.app.photo import drop_upload, keep_upload, photo_file
from denoiser.app.photo_tab import CLEAN_SIGMA, PhotoTab
from denoiser.app.png_settings import read_settings, save_with_settings
from tests.app.browser import CHROMIUM, browser_page, click_result, no_errors, open_app, screenshots
from tests.conftest import app_page

browser = pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="make test installs Debian's chromium")


def _photo(path: Path, size: tuple[int, int], seed: int = 0) -> Path:
    """A smooth picture with visible noise on it, as a PNG."""
    import torch

    g = torch.Generator().manual_seed(seed)
    coarse = torch.rand((1, 3, size[1] // 40 + 2, size[0] // 40 + 2), generator=g)
    smooth = torch.nn.functional.interpolate(coarse, size=(size[1], size[0]), mode="bilinear")[0]
    noisy = (smooth + 0.08 * torch.randn(smooth.shape, generator=g)).clamp(0, 1).mul(255).round().byte()
    Image.fromarray(noisy.permute(1, 2, 0).numpy()).save(path)  # (3, H, W) -> (H, W, 3)
    return path


# ---- handlers ----------------------------------------------------------------------------------------------------


def test_an_upload_is_copied_out_of_the_cache_and_removed_with_its_session(tmp_path, monkeypatch):
    """Issue 41 item 4: Run reads the session's copy of the upload, so the cache sweep deleting the upload does not
    matter; the copy goes when the photo is replaced or the session ends (the state's delete_callback)."""
    monkeypatch.setenv("GRADIO_TEMP_DIR", str(tmp_path / "gradio"))
    (tmp_path / "gradio").mkdir()
    upload = _photo(tmp_path / "upload.png", (40, 30))
    kept = keep_upload(str(upload))
    assert Path(kept["copy"]).read_bytes() == upload.read_bytes() and kept["source"] == str(upload)
    upload.unlink()  # what the sweep does
    assert photo_file(str(upload), kept) == kept["copy"]
    with pytest.raises(ValueError, match="your upload has expired .*upload the photo again"):
        photo_file(str(upload), None)  # the session's copy is gone too: say so, not "does not exist"
    drop_upload(kept)
    assert not Path(kept["copy"]).parent.exists()
    drop_upload(None)  # nothing kept: nothing to do


def test_use_these_settings_reads_the_result_whichever_picture_is_selected(weights, tmp_path):
    """Issue 41 item 12: the Edit form refilled from the result's PNG; "your image" selected reads the result's."""
    import gradio as gr

    e = PhotoTab(Page(Engine(weights)))
    settings = {"model": "tiny-classes", "operation": "edit", "class": "1", "guidance_scale": 2.0, "sigma": 0.0,
                "strength": 0.4, "add_noise": 0.1, "steps": 7, "seed": 5, "pag_scale": 0.5, "chain": True}
    result = save_with_settings(Image.new("RGB", (16, 16)), tmp_path, settings)
    Image.new("RGB", (16, 16)).save(tmp_path / "your-image.png")
    out = e.use_settings([(str(tmp_path / "your-image.png"), "your image"), (str(result), "result")], 0)
    values = [o["value"] for o in out[:-1]]
    assert values == ["tiny-classes", "1", 2.0, "edit", 0.0, 0.4, 0.1, 7, 5, 0.5, ""] and "restored: press Run" in out[-1]
    assert out[1]["choices"] == ["(any)", "0", "1", "2"]  # the class among its model's classes
    plain = e.use_settings([(str(tmp_path / "your-image.png"), "your image")], 0)
    assert plain[-1] == "this result carries no settings" and all(isinstance(o, type(gr.skip())) for o in plain[:-1])


def test_run_says_before_it_runs_what_it_works_on(weights):
    """Issue 41 item 10, issue 52: what Run works on is said before it runs, by the one rule (RestoreRequest.tiled):
    a denoise, noise added first or not, works on the whole photo; the chains on the centre square."""
    e = PhotoTab(Page(Engine(weights)))
    assert "whole photo at its own size" in e.scope("tiny-classes", "denoise", 0, None)
    noisy = e.scope("tiny-classes", "denoise", 0.2, None)
    assert "added to your whole photo, then removed" in noisy and "centre square" not in noisy
    assert "centre square of your photo at the model's size (16x16)" in e.scope("tiny-classes", "edit", 0, None)
    assert "centre square" in e.scope("tiny-classes", "denoise (sampled)", 0, None)
    limit = e.engine.photo_limit("tiny-classes")
    assert f"up to **{limit:.1f} megapixels** with tiny-classes" in e.sizes("tiny-classes")


@pytest.mark.parametrize("operation", ["denoise", "denoise (sampled)", "edit", "inpaint"])
def test_run_without_a_photo_asks_for_one_before_any_work(weights, operation, caplog):
    """The long walk, seed 9 step 43: Run on "edit" with no photo reached the restore and failed there ("TypeError:
    image must be a PIL image, got NoneType", a traceback in the log). Every operation now says what to do, on the
    status line, before any work."""
    e = app_page(weights).tab(PhotoTab)  # built: a run yields updates keyed by its components
    run = e.run_photo("tiny-classes", "(any)", 1.0, None, operation, 0.1, 0.3, 0.0, 3, 0)
    assert next(run)[e.status].startswith("**not started**: upload a photo first")
    with pytest.raises(Exception, match="upload a photo first"):
        next(run)
    assert not [r for r in caplog.records if r.levelname == "ERROR"]


def test_a_run_writes_the_settings_that_ran_and_they_come_back(weights, tmp_path, monkeypatch):
    """Issue 52: the Photo tab's run goes through the one restore run; its PNG carries what ran (the class and guidance
    of a tiled denoise included) and "use these settings" fills the form with them."""
    monkeypatch.setenv("GRADIO_TEMP_DIR", str(tmp_path))
    e = app_page(weights).tab(PhotoTab)  # built: a run yields updates keyed by its components
    photo = _photo(tmp_path / "photo.png", (40, 24))
    *_, last = e.run_photo("tiny-classes", "1", 2.0, None, "denoise", 0.0, 0.3, 0.1, 5, 3, photo=str(photo))
    shown, status = last[e.result], last[e.status]
    assert [label for _, label in shown] == ["your image", "noisy (σ 0.1 added)", "result"]
    settings = read_settings(shown[-1][0])
    assert settings | {"class": "1", "guidance_scale": 2.0, "add_noise": 0.1, "sigma": 0.1, "chain": False,
                       "operation": "denoise", "size": [40, 24]} == settings
    assert Image.open(shown[-1][0]).size == (40, 24) and "done: denoise with tiny-classes, at 40x24" in status
    assert status.endswith(settings["precision"]) and settings["precision"] in ("float32", "bfloat16")  # what ran
    values = [o.get("value") if isinstance(o, dict) else None for o in e.use_settings(shown, 2)[:-1]]  # PHOTO_FORM's order
    assert values[:5] == ["tiny-classes", "1", 2.0, "denoise", 0.1] and values[6:9] == [0.1, 5, 3]
    assert values[5] is None  # no strength: a denoise has none, and the form keeps its own



@pytest.mark.parametrize(("steps", "said"), [(None, "steps must be a whole number in 1..1000: the box is empty"),
                                             (2.5, "steps must be a whole number in 1..1000, got 2.5")])
def test_an_empty_or_decimal_steps_box_is_refused_in_words(weights, tmp_path, steps, said):
    """Issue 60 item 3: an empty Edit steps box ran 1 step, and 2.5 ran 2: now both are refused before any work,
    quoting what was typed."""
    e = app_page(weights).tab(PhotoTab)  # built: a run yields updates keyed by its components
    photo = _photo(tmp_path / "photo.png", (40, 24))
    run = e.run_photo("tiny-classes", "(any)", 1.0, None, "edit", 0.0, 0.3, 0.0, steps, 0, photo=str(photo))
    assert next(run)[e.status].startswith(f"**not started**: {said}")
    with pytest.raises(Exception, match=re.escape(said)):
        next(run)



def test_inpaint_without_a_mask_and_a_tiny_photo_are_refused_on_the_status_line(weights, tmp_path):
    """Issue 60 item 4: inpaint without a mask was refused by a toast alone, the status line left blank; a 1x1 photo was
    accepted at upload and failed at Run with "images must be (B, C, H, W) with H, W >= 2". Both now say why in
    words where the person looks: the status line, and under the upload box."""
    e = app_page(weights).tab(PhotoTab)  # built: a run yields updates keyed by its components
    photo = _photo(tmp_path / "photo.png", (40, 24))
    editor = {"background": Image.open(photo).convert("RGB"), "layers": [], "composite": None}
    run = e.run_photo("tiny-classes", "(any)", 1.0, editor, "inpaint", 0.0, 0.3, 0.0, 3, 0, photo=str(photo),
                     shown=str(photo))
    lines = []
    with pytest.raises(Exception, match="inpaint needs a mask"):
        for out in run:
            lines.append(out.get(e.status))
    assert lines[-1].startswith("**not done**: inpaint needs a mask: paint")
    tiny = _photo(tmp_path / "tiny.png", (1, 1))
    editor_value, text, *_ = e.load_photo(str(tiny), None, "tiny-classes")
    assert editor_value is None
    assert text == "**This file cannot be used:** the picture is 1x1 pixels, too small to restore: use one at least 8 " \
                   "pixels a side"


# ---- in the browser ----------------------------------------------------------------------------------------------


def _photo_tab(page):
    page.get_by_role("tab", name="Photo").click()
    page.locator("#photo-run").wait_for(timeout=30_000)


def _upload(page, path: Path) -> None:
    clear = page.locator("#photo").get_by_role("button", name="Clear")
    if clear.count():
        clear.first.click()
    page.locator("#photo input[type=file]").set_input_files(str(path))
    page.locator("#photo-text").get_by_text(re.compile(r"your photo: \d+x\d+|Too large")).wait_for(timeout=60_000)


def _results(page) -> list[str]:
    """The Edit gallery's picture addresses, in order."""
    return page.evaluate("() => [...new Set([...document.querySelectorAll('#photo-result button.thumbnail-item img, "
                         "#photo-result .thumbnail-item img')].map(i => i.src))]")


def _png(url: str) -> Image.Image:
    import httpx

    return Image.open(io.BytesIO(httpx.get(url, timeout=30).content))


def _set_number(page, elem_id: str, value) -> None:
    box = page.locator(f"#{elem_id} input[type=number]")
    box.fill(str(value))
    box.press("Enter")


def _stop_during(page, running: str) -> None:
    """Wait for the status line to show the run's progress, press Stop, wait for the status to say so; the live
    preview's label then says it stopped (issue 72 item 8: it kept "running:")."""
    page.locator("#photo-status").get_by_text(re.compile(running)).wait_for(timeout=60_000)
    # the live preview's first picture may come a moment after the first progress line (a busy CI machine)
    page.locator("#photo-preview img").wait_for(timeout=60_000)
    page.locator("#photo-stop").click()
    try:
        page.locator("#photo-status").get_by_text(re.compile(r"stopped at (step|tile) \d+ / \d+")).wait_for(timeout=20_000)
    except Exception:
        raise AssertionError(f"after Stop the status line says: {page.locator('#photo-status').inner_text()!r}") from None
    label = page.locator("#photo-preview [data-testid=block-label]").inner_text()
    assert label.startswith("stopped:") and "running" not in label, label


@browser
def test_browser_stop_keeps_the_last_results_and_they_carry_their_settings(server, tmp_path):
    """Issue 41 items 2, 11, 12, 14 (Edit gallery, labels): a finished denoise of an example picture shows the σ it
    estimated (≈ 0: "already clean", with what to do); its result is named after and carries its settings, at the
    picture's size; Stop of a tiled denoise and of an edit at 1000 steps leaves that result and its text (before: the
    gallery showed "your image" + a noise "predicted x0", or the input alone), the live preview shows where it stopped;
    "use these settings" refills the form; the gallery is no larger than its pictures."""
    shots = screenshots(tmp_path)
    big = _photo(tmp_path / "big.png", (1600, 1200))  # ~1.9 megapixels: enough tiles to press Stop during
    with browser_page(server, height=900) as page:
        _photo_tab(page)
        assert page.get_by_text("noise level σ").count() >= 1  # the exact term kept beside the plain words
        examples = page.locator("#photo").locator("xpath=ancestor::div[contains(@class,'column')][1]")
        examples.locator(".gallery-item, tbody tr").first.click()  # cube.png: a clean drawing
        page.locator("#photo-text").get_by_text("your photo: 256x256").wait_for(timeout=30_000)
        page.locator("#photo-run").click()
        page.locator("#photo-status").get_by_text("done: denoise").wait_for(timeout=120_000)
        text = page.locator("#photo-result-text").inner_text()
        assert re.search(r"Noise level σ removed: 0\.0\d\d", text) and "already clean" in text and "add noise first" in text
        before = _results(page)
        assert len(before) == 2
        result = _png(before[-1])
        settings = json.loads(result.text["denoiser"])
        assert result.size == (256, 256) and settings["operation"] == "denoise" and settings["size"] == [256, 256]
        assert settings["sigma_removed"] < CLEAN_SIGMA and re.search(r"/[\w.-]+-denoise-sigma[\d.]+-256x256\.png$", before[-1])
        page.screenshot(path=str(shots / "app-photo-done.png"), full_page=True)
        gallery = page.locator("#photo-result").bounding_box()  # sized to its pictures: no large empty area
        bottom = max(b["y"] + b["height"] for b in (i.bounding_box() for i in page.locator("#photo-result img").all()))
        assert gallery["y"] + gallery["height"] - bottom < 60, f"{gallery} ends far below its pictures ({bottom})"
        no_errors(page)

        # Stop a tiled denoise of a larger photo: the results and their text stay
        _upload(page, big)
        page.locator("#photo-run").click()
        _stop_during(page, r"denoise \(tiles\): tile \d+ / \d+")  # issue 60 item 9: tiles counted as tiles
        page.wait_for_timeout(1000)
        assert _results(page) == before and page.locator("#photo-result-text").inner_text() == text
        stopped = page.locator("#photo-status").inner_text()
        assert "stopped at tile" in stopped and "the tiles denoised so far" in stopped
        assert "the results shown are from the run before" in stopped
        assert page.locator("#photo-preview img").count() == 1  # how far it got
        page.screenshot(path=str(shots / "app-photo-stopped-tiles.png"), full_page=True)

        # Stop an edit at 1000 steps, strength 1
        page.get_by_role("radio", name="edit", exact=True).check()
        _set_number(page, "strength", 1)
        _set_number(page, "photo-steps", 1000)
        page.locator("#photo-run").click()
        _stop_during(page, r"edit: step \d+ / 1000")
        page.wait_for_timeout(1000)
        assert _results(page) == before and page.locator("#photo-result-text").inner_text() == text
        assert page.locator("#photo-preview img").count() == 1
        page.screenshot(path=str(shots / "app-photo-stopped.png"), full_page=True)
        no_errors(page)

        # the result's settings back into the form
        click_result(page, "photo-result", 0)  # "your image": the result's settings are read
        page.locator("#photo-use-settings").click()
        page.locator("#photo-status").get_by_text("restored: press Run").wait_for(timeout=10_000)
        page.wait_for_function("() => document.querySelector('#photo-steps input[type=number]').value === '50'", timeout=10_000)
        assert page.get_by_role("radio", name="denoise", exact=True).is_checked()
        page.locator("#sigma").wait_for(state="visible", timeout=10_000)  # the operation's own slider
        page.locator("#strength").wait_for(state="hidden", timeout=10_000)


@browser
def test_browser_an_upload_outlives_the_cache_sweep_and_denoises_at_its_own_size(server, demo, weights, tmp_path,
                                                                                    monkeypatch):
    """Issue 41 items 4 and 9: upload, Gradio's sweep deletes the cached upload, Run still works (before: "the upload
    does not exist"), and the photo is denoised at its own size, 700x500 (before: a copy cut to 512x366). The
    megapixel limit shows before the upload; a photo over it is refused before any work, in words."""
    from gradio.route_utils import delete_files_created_by_app

    photo = _photo(tmp_path / "photo.png", (700, 500))
    shots = screenshots(tmp_path)
    with browser_page(server) as page:
        _photo_tab(page)
        # the limit, before any upload (the first page of a server measures the model's speed first, about a second)
        page.locator("#photo-sizes").get_by_text(re.compile(r"up to [\d.]+ megapixels with \S+")).wait_for(timeout=30_000)
        sizes = page.locator("#photo-sizes").inner_text()
        _upload(page, photo)
        page.locator("#photo-text").get_by_text("your photo: 700x500").wait_for(timeout=30_000)
        try:
            page.locator("#photo-scope").get_by_text(re.compile(r"about \d+ (s|min)[^(]*\([\d,]+ tiles at [\d,]+ a second\) on "
                                                              r"this server")).wait_for(timeout=60_000)  # the wait, before Run
        except Exception:
            raise AssertionError(page.locator("#photo-scope").inner_text()) from None
        delete_files_created_by_app(demo, None)  # the sweep, at once: every file Gradio made, the upload included
        page.locator("#photo-run").click()
        page.locator("#photo-status").get_by_text("done: denoise").wait_for(timeout=120_000)
        no_errors(page)
        assert "700x500 input, denoised at its own size" in page.locator("#photo-result-text").inner_text()
        assert _png(_results(page)[-1]).size == (700, 500)  # the download: full size
        page.screenshot(path=str(shots / "app-photo-own-size.png"), full_page=True)

    # the limit is what the server denoises in DENOISER_PHOTO_SECONDS at its measured speed: here 0.2 MP (the speed
    # fixed, for the server's engine too, which runs in this process: a tiny model's measured rate is mostly noise)
    model = re.search(r"megapixels with (\S+) ", sizes).group(1)  # the Photo tab's model
    monkeypatch.setattr(Engine, "tile_rate", lambda self, name: 1000.0)
    monkeypatch.setenv("DENOISER_PHOTO_SECONDS", str(0.2 * Engine(weights).photo_time(model, 1000, 1000).seconds))
    with browser_page(server) as page:  # issue 51 item 13: over the budget, a scaled copy is denoised, and said so
        _photo_tab(page)
        page.locator("#photo-sizes").get_by_text(re.compile(r"up to [\d.]+ megapixels")).wait_for(timeout=30_000)
        limit = float(re.search(r"up to ([\d.]+) megapixels", page.locator("#photo-sizes").inner_text()).group(1))
        assert limit < 0.35
        _upload(page, photo)
        page.locator("#photo-text").get_by_text("over this server's photo budget").wait_for(timeout=30_000)
        # the expected wait, said before Run: the scaled copy's
        page.locator("#photo-scope").get_by_text(re.compile(r"denoise a copy of your photo scaled down to \d+x\d+.*: about "
                                                          r"\d+ (s|min).* on this server")).wait_for(timeout=30_000)
        page.locator("#photo-run").click()
        page.locator("#photo-status").get_by_text(re.compile(r"done: denoise .*scaled from 700x500")).wait_for(timeout=120_000)
        no_errors(page)
        result = _results(page)[-1]
        w, h = _png(result).size
        assert w * h <= limit * 1.2e6 and abs(w / h - 1.4) < 0.02 and "scaled-from-700x500" in result
        assert "a copy scaled to" in page.locator("#photo-result-text").inner_text()


@browser
def test_browser_the_scope_of_run_is_said_before_it_runs(server, tmp_path):
    """Issue 41 item 10, issue 52: what Run works on is said at once when the form changes: the whole photo for a
    denoise (the round trip included), the centre square at the model's size for the chains."""
    with browser_page(server) as page:
        _photo_tab(page)
        page.locator("#photo-scope").get_by_text("denoise your whole photo at its own size").wait_for(timeout=30_000)
        _set_number(page, "add-noise", 0.2)
        page.locator("#photo-scope").get_by_text("added to your whole photo, then removed").wait_for(timeout=10_000)
        page.locator("#operation").get_by_text("edit", exact=True).click()
        page.locator("#photo-scope").get_by_text(re.compile(r"on the centre square of your photo at the model's size "
                                                           r"\(\d+x\d+\)")).wait_for(timeout=10_000)


@browser
def test_browser_the_photo_tab_on_a_phone(server, tmp_path):
    """The Photo tab at 390x844 and 1280x900, screenshots to look at: Run with its status and results together."""
    from playwright.sync_api import sync_playwright

    from tests.app.browser import BROWSER_ARGS

    shots = screenshots(tmp_path)
    photo = _photo(tmp_path / "phone.png", (640, 480))
    with sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=BROWSER_ARGS)
        try:
            for name, viewport in (("phone", {"width": 390, "height": 844}), ("wide", {"width": 1280, "height": 900})):
                page = chromium.new_page(viewport=viewport)
                open_app(page, server)
                _photo_tab(page)
                _upload(page, photo)
                page.locator("#photo-run").click()
                page.locator("#photo-status").get_by_text("done: denoise").wait_for(timeout=120_000)
                page.locator("#photo-run").scroll_into_view_if_needed()
                run, results = page.locator("#photo-run").bounding_box(), page.locator("#photo-result").bounding_box()
                assert 0 < results["y"] - run["y"] < 300, f"the results are far from Run: {run}, {results}"
                page.screenshot(path=str(shots / f"app-photo-{name}.png"), full_page=True)
                page.close()
        finally:
            chromium.close()


def test_a_clean_picture_is_said_to_be_clean():
    from denoiser.app.photo_tab import _sigma_text

    assert "already clean" in _sigma_text(0.002, 0.0) and "estimated" in _sigma_text(0.002, 0.0)
    assert "already clean" not in _sigma_text(0.08, 0.0) and "20.4/255" in _sigma_text(0.08, 0.0)
    assert read_settings(Path("/nonexistent.png")) == {}


def test_a_photo_denoise_counts_tiles_as_tiles_and_stop_says_so():
    """Issue 60 item 9: the tiled denoise's progress counted tiles while saying "step"."""
    from denoiser.app.streaming import progress_text

    line = progress_text("denoise (tiles)", 256, 1024, 2.0, unit="tile")
    assert line == "denoise (tiles): tile 256 / 1024 · about 6 s left"
    assert Jobs._stopped_text(line) == ("**stopped at tile 256 / 1024**: the preview shows the tiles denoised so "
                                            "far, not a result; the results shown are from the run before")
    assert Jobs._stopped_text("edit: step 3 / 50 · about 9 s left").startswith("**stopped at step 3 / 50**: the "
                                                                                  "preview is that step's predicted")


def test_the_inpaint_brush_is_scaled_to_the_picture(weights, tmp_path):
    """Issue 60 item 9: the brush covered 80 % of a 64x64 picture in one stroke; it is now a twentieth of the picture's
    shorter side as the editor shows it (a 64x64 emoji: 3 pixels; a photo shown at 512x366: 18)."""
    e = PhotoTab(Page(Engine(weights)))
    sizes = {}
    for name, size in (("emoji.png", (64, 64)), ("photo.png", (700, 500))):
        update, *_ = e.load_photo(str(_photo(tmp_path / name, size)), None, "tiny-classes")
        assert update["value"]["background"].size == (size if size[0] <= 512 else (512, 366))
        sizes[name] = update["brush"].default_size
    assert sizes == {"emoji.png": 3, "photo.png": 18}


@pytest.mark.parametrize("operation", ["denoise", "edit", "inpaint"])
def test_a_jpeg_gives_the_same_pixels_through_the_command_line_and_the_app(weights, tmp_path, monkeypatch, operation):
    """Issue 59 finding 1: the command line decoded a photo by one rule and the Photo tab by another (its chains read
    the editor's 512-px LANCZOS copy), so for an 800x600 JPEG the model's inputs differed by a level and the results
    by up to 1/255. Now every door decodes by denoiser.restore.plan.read_photo: the same JPEG with the same settings
    (the mask painted on the editor's copy, or given as a file at the photo's size) gives the same PNG."""
    from denoiser.app.photo import photo_preview
    from denoiser.cli.main import main

    monkeypatch.setenv("GRADIO_TEMP_DIR", str(tmp_path))
    photo = tmp_path / "photo.jpg"
    Image.open(_photo(tmp_path / "photo.png", (800, 600), seed=3)).save(photo, quality=90)
    preview, _ = photo_preview(str(photo))  # what the editor shows and the mask is painted on
    layer = Image.new("RGBA", preview.size, (0, 0, 0, 0))
    layer.paste((255, 255, 255, 255), (preview.width // 4, preview.height // 4, preview.width // 2, preview.height // 2))
    mask_file = tmp_path / "mask.png"
    mask = Image.new("L", (800, 600), 0)
    mask.paste(255, (200, 150, 400, 300))  # the same quarter, at the photo's size
    mask.save(mask_file)
    editor = {"background": preview, "layers": [layer] if operation == "inpaint" else [], "composite": None}
    e = app_page(weights).tab(PhotoTab)  # built: a run yields updates keyed by its components
    *_, last = e.run_photo("tiny-classes", "1", 2.0, editor, operation, 0.05, 0.4, 0.0, 3, 7, photo=str(photo),
                          shown=str(photo))
    app_png = last[e.result][-1][0]
    cli_png = tmp_path / "cli.png"
    args = [operation, "--model", str(weights / "tiny-classes"), "--image", str(photo), "--out", str(cli_png),
            "--class-label", "1", "--guidance-scale", "2.0", "--steps", "3", "--seed", "7"]
    args += {"denoise": ["--sigma", "0.05"], "edit": ["--strength", "0.4"], "inpaint": ["--mask", str(mask_file)]}[operation]
    assert main(args) == 0
    app, cli = (torch.from_numpy(np.asarray(Image.open(p).convert("RGB"))).int() for p in (app_png, cli_png))
    assert app.shape == cli.shape and (app.shape[:2] == (600, 800) if operation == "denoise" else app.shape[0] == app.shape[1])
    assert torch.equal(app, cli), f"{operation}: the app's result differs from the CLI's by {(app - cli).abs().max()}"

"""The Attention tab (denoiser/app/attention_tab.py): the maps averaged over every step are a job like Generate
(issue 41 item 7: progress with a step count, Stop, the budget); a view read with the sliders of the generation before
waits for the new one; the averaging and the Heads statistics pressed right after their Stop run."""

from __future__ import annotations

import pytest

gr = pytest.importorskip("gradio")

from denoiser.app.attention_tab import AttentionTab  # noqa: E402
from denoiser.app.engine import Engine  # noqa: E402
from denoiser.app.page import Page  # noqa: E402
from denoiser.app.sample_tab import SampleTab  # noqa: E402
from denoiser.request import SampleRequest  # noqa: E402
from tests.conftest import app_page  # noqa: E402


def _run(gen_fn):
    """Every update a generator handler yields, until it ends."""
    return list(gen_fn)


def test_the_averaged_maps_are_a_job_with_progress_and_a_result_line(weights):
    page = app_page(weights)
    tab = page.tab(AttentionTab)
    gen = page.engine.generate("tiny-classes", SampleRequest(scheduler="ddim", steps=6, seed=0, num_images=2))
    updates = _run(tab.mean_maps(gen, 1, (3, 4), progress=lambda *a, **k: None))
    texts = [u[tab.mean_status] for u in updates if isinstance(u.get(tab.mean_status), str)]
    assert any(t.startswith("averaging: step") for t in texts)  # progress with its step count
    assert updates[-1][tab.mean_status] == "done: the maps of pixel (y 3, x 4) averaged over all 6 steps"
    assert updates[-1][tab.maps].size == page.engine.views.mean_attention_maps(gen, 1, (3, 4)).size


def test_the_averaged_maps_need_a_pixel_and_say_so_on_their_line(weights):
    page = app_page(weights)
    tab = page.tab(AttentionTab)
    gen = page.engine.generate("tiny-classes", SampleRequest(scheduler="ddim", steps=2, seed=0, num_images=1))
    run = tab.mean_maps(gen, 0, None, progress=lambda *a, **k: None)
    first = next(run)
    assert list(first) == [tab.mean_status]  # the status line only: the maps shown stay
    assert first[tab.mean_status].startswith("**not started**: click a pixel of the image first")
    with pytest.raises(gr.Error, match="click a pixel"):
        next(run)  # an API caller gets the error too


def test_a_class_models_done_line_names_the_class_it_drew(weights, tmp_path, monkeypatch):
    """Issue 51 item 14: a class model's status line said "done: 2 image(s), 2 steps" without the class it drew."""
    monkeypatch.setenv("GRADIO_TEMP_DIR", str(tmp_path))
    page = app_page(weights)
    sample = page.tab(SampleTab)
    name = page.engine.classes("tiny-classes")[1]
    last = _run(sample.generate("tiny-classes", "ddim", 2, 0, 2, name, progress=lambda *a, **k: None))[-1][sample.status]
    assert last.startswith(f"done: 2 image(s) of class {name}, 2 steps"), last
    last = _run(sample.generate("tiny-classes", "ddim", 2, 0, 2, "(any)", progress=lambda *a, **k: None))[-1][sample.status]
    assert last.startswith("done: 2 image(s), 2 steps"), last  # no class chosen: none named


JOBS = {"mean": ("Attention", "mean_attention_maps", "done: the maps of pixel"),
        "stats": ("Heads", "head_table", "done:")}


@pytest.mark.parametrize("job", list(JOBS))
def test_browser_a_job_pressed_right_after_its_stop_runs(server, monkeypatch, job):
    """The Stop-then-run race of Generate (issue 51 item 1) on the Attention tab's averaging and the Heads tab's
    statistics: a press 0.1 s after Stop did nothing (Gradio's page skips a click on a job it still counts as
    running). The page now holds it back until the stopped job has ended (controls.JOB's trigger mode
    "always_last"), and its run ends with its done line."""
    import time
    from pathlib import Path

    from tests.app.browser import CHROMIUM, browser_page, type_number

    if not Path(CHROMIUM).exists():
        pytest.skip("make test installs Debian's chromium")
    from denoiser.app.attention_views import AttentionViews

    tab, method, done = JOBS[job]
    work, runs = getattr(AttentionViews, method), []

    def slow(self, *args, on_step=None, **kwargs):  # the first run's steps as long as a real model's on a busy CPU
        runs.append(time.monotonic())
        pause = 0.2 if len(runs) == 1 else 0.0  # Stop lands inside it; the run pressed after Stop only has to end
        return work(self, *args, on_step=lambda *a: (time.sleep(pause), on_step(*a))[1] if on_step else None, **kwargs)

    monkeypatch.setattr(AttentionViews, method, slow)
    with browser_page(server) as page:
        type_number(page, "steps", 30)
        page.locator("#generate").click()
        page.locator("#status").get_by_text("done:").wait_for(timeout=60_000)
        page.get_by_role("tab", name=tab, exact=True).click()
        if job == "mean":  # the maps are of a clicked pixel
            image = page.locator("#clickable img")
            image.wait_for(timeout=30_000)
            image.click(position={"x": 10, "y": 10})
            page.locator("#maps img").wait_for(timeout=30_000)
        page.locator(f"#{job}-run").click()
        page.locator(f"#{job}-status").get_by_text("step").wait_for(timeout=30_000)
        page.wait_for_timeout(1000)
        page.locator(f"#{job}-stop").click()
        page.wait_for_timeout(100)
        page.locator(f"#{job}-run").click()
        page.locator(f"#{job}-status").get_by_text(done).wait_for(timeout=90_000)
        assert len(runs) == 2


def test_a_view_read_with_the_generation_befores_step_waits_for_the_new_one(weights):
    """The long walk, seed 10 step 94: after a 2-step Generate, the layer selector's change (reset to 0 by the new
    generation) read the step slider before its new value landed, and the page showed "step must be a whole number
    in 0..1, got 89". A view whose image or step is out of the generation's range is left as it is (the step
    slider's change, with its new value, follows); in range, it is drawn."""
    tab = AttentionTab(Page(Engine(weights)))  # its views' handlers need no page built
    gen = tab.engine.generate("tiny-classes", SampleRequest(scheduler="ddim", steps=2, seed=0, num_images=1))
    skip = gr.skip()
    assert tab.restage(gen, 0, 89, (1, 1), 0, 0) == (skip,) * 3
    assert tab.refresh(gen, 0, 89, (1, 1), 0, 0) == (skip,) * 4
    assert tab.refresh(gen, 3, 1, (1, 1), 0, 0) == (skip,) * 4  # an image of the generation before
    stages, text, heads = tab.restage(gen, 0, 1, (1, 1), 0, 0)
    assert stages is not None and "step 1" in text



"""The Attention and Heads tabs' long work as jobs (issue 41 item 7): the maps averaged over every step and the
Heads statistics run through the one-job path (streaming.stream): progress with a step count, Stop, the budget."""

from __future__ import annotations

import pytest

gr = pytest.importorskip("gradio")

from denoiser.app.attention_tab import AttentionTab  # noqa: E402
from denoiser.app.engine import Engine  # noqa: E402
from denoiser.app.handlers import Handlers  # noqa: E402
from denoiser.app.heads_tab import HeadsTab  # noqa: E402
from denoiser.app.jobs import Jobs  # noqa: E402


def _run(gen_fn):
    """Every update a generator handler yields, until it ends."""
    return list(gen_fn)


def test_the_averaged_maps_are_a_job_with_progress_and_a_result_line(weights):
    h = Handlers(Engine(weights))
    gen = h.engine.generate("tiny-classes", "ddim", steps=6, seed=0, num_images=2)
    updates = _run(AttentionTab(h.engine, h.jobs).mean_maps(gen, 1, (3, 4), progress=lambda *a, **k: None))
    texts = [u[1] for u in updates if isinstance(u[1], str)]
    assert any(t.startswith("averaging: step") for t in texts)  # progress with its step count
    maps, last = updates[-1]
    assert last == "done: the maps of pixel (y 3, x 4) averaged over all 6 steps"
    assert maps.size == h.engine.views.mean_attention_maps(gen, 1, (3, 4)).size


def test_the_averaged_maps_need_a_pixel_and_say_so_on_their_line(weights):
    h = Handlers(Engine(weights))
    gen = h.engine.generate("tiny-classes", "ddim", steps=2, seed=0, num_images=1)
    run = AttentionTab(h.engine, h.jobs).mean_maps(gen, 0, None, progress=lambda *a, **k: None)
    skip, line = next(run)
    assert line.startswith("**not started**: click a pixel of the image first")
    with pytest.raises(gr.Error, match="click a pixel"):
        next(run)  # an API caller gets the error too


def test_the_heads_statistics_are_a_job_that_stops(weights):
    from denoiser.app.streaming import stream

    h = Handlers(Engine(weights))
    gen = h.engine.generate("tiny-classes", "ddim", steps=2, seed=0, num_images=1)
    updates = _run(HeadsTab(h.engine, h.jobs).head_stats(gen, 0, progress=lambda *a, **k: None))
    assert any(isinstance(u[3], str) and u[3].startswith("measuring: step") for u in updates)
    chart, rows, layers, line = updates[-1]
    assert line.startswith("done:") and rows and layers["choices"] and layers["value"] == []
    # the walk, seed 1 step 140: a layer picked from another model's statistics stayed picked when this model's were
    # listed, and Switch off then failed in Gradio's own words ("Value: 'up.1.attn.0' ... not in the list of
    # choices"); now the new list keeps only this model's layers
    mine = layers["choices"][0]
    *_, (_, _, relisted, _) = _run(HeadsTab(h.engine, h.jobs).head_stats(gen, 0, ["up.1.attn.0", mine], progress=lambda *a, **k: None))
    assert relisted["value"] == [mine] and "up.1.attn.0" not in relisted["choices"]
    # Stop: the page closes the handler at a yield; the worker stops at its next UNet call and is joined
    import time

    full: list = []
    h.engine.views.head_table(gen, 0, on_step=lambda *a: full.append(1))

    def slow(on_step):  # each UNet call takes 50 ms longer, so the close comes mid-way
        return h.engine.views.head_table(gen, 0, on_step=lambda *a: (calls.append(1), time.sleep(0.05), on_step(*a)))

    calls: list = []
    job = stream(slow, lambda *a, **k: None, "measuring")
    next(job)
    job.close()
    stopped = len(calls)
    time.sleep(0.3)
    assert 0 < stopped < len(full) and len(calls) == stopped  # stopped mid-way, and nothing ran after the close


def test_stop_during_a_job_without_a_preview_does_not_speak_of_one(weights):
    """Issue 51 item 3: Stop during "average the maps over every step" or "Compute statistics" said "the preview is
    that step's predicted clean image (x₀)"; neither tab has a preview. The line each job shows while it runs, as Stop
    turns it into its stopped line (Jobs.stopped)."""
    h = Handlers(Engine(weights))
    gen = h.engine.generate("tiny-classes", "ddim", steps=6, seed=0, num_images=1)
    quiet = dict(progress=lambda *a, **k: None)
    for updates, shown in ((_run(AttentionTab(h.engine, h.jobs).mean_maps(gen, 0, (3, 4), **quiet)), "maps shown"),
                           (_run(HeadsTab(h.engine, h.jobs).head_stats(gen, 0, **quiet)), "charts and table shown")):
        running = [u[-1] for u in updates[:-1] if isinstance(u[-1], str)][0]
        stopped = Jobs._stopped_text(running)
        assert stopped.startswith("**stopped at step") and shown in stopped, stopped
        assert "preview" not in stopped and "x₀" not in stopped, stopped
    sampling = Jobs._stopped_text("denoising: step 3 / 50 · about 2 s left")  # Generate's keeps its preview
    assert "the preview is that step's predicted clean image (x₀)" in sampling


def test_switch_off_before_a_generation_hints_as_compute_statistics_does(weights):
    """Issue 51 item 4: the same "no generation yet" case was a Warning from Compute statistics and an Error from
    Switch off. Both now warn and say it on their line."""
    h = Handlers(Engine(weights))
    quiet = dict(progress=lambda *a, **k: None)
    stats = _run(HeadsTab(h.engine, h.jobs).head_stats(None, 0, **quiet))  # neither raises: no Error toast
    off = _run(HeadsTab(h.engine, h.jobs).switch_off(None, ["mid_attn"], "all", **quiet))
    assert stats[-1][-1] == off[-1][-1] and off[-1][-1].startswith("generate images first")


def test_switch_off_is_a_job_with_its_own_status_line(weights):
    """Issue 60 item 1: "Switch off and regenerate" had no status line of its own and no Stop (its progress showed far
    below the button). It now says how far it is and what it did on its own line, and refuses in words."""
    h = Handlers(Engine(weights))
    gen = h.engine.generate("tiny-classes", "ddim", steps=3, seed=0, num_images=1)
    layer = h.engine.views.records(gen, 0)[0].name
    updates = _run(HeadsTab(h.engine, h.jobs).switch_off(gen, [layer], "all", progress=lambda *a, **k: None))
    lines = [u[-1] for u in updates if isinstance(u[-1], str)]
    assert any(line.startswith("switching off: step") for line in lines), lines
    assert lines[-1] == f"done: {layer} switched off, 3 steps" and "switched to identity attention" in updates[-1][1]
    refused = HeadsTab(h.engine, h.jobs).switch_off(gen, [], "all", progress=lambda *a, **k: None)
    assert next(refused)[-1].startswith("**not started**: choose at least one attention layer to switch off")
    # a layer listed by another model's statistics (the walk, seed 11 step 134): said in words, on the status line
    lines = []
    with pytest.raises(Exception, match="not a layer of tiny-classes, the model of the images shown"):
        for out in HeadsTab(h.engine, h.jobs).switch_off(gen, ["down.7.attn.3"], "all", progress=lambda *a, **k: None):
            lines.append(out[-1])
    assert lines[-1].startswith("**not done**: down.7.attn.3: not a layer of tiny-classes") and "Compute statistics" in lines[-1]
    stopped = Jobs._stopped_text("switching off: step 2 / 3 · about 1 s left")
    assert stopped.startswith("**stopped at step 2 / 3**")


def test_a_class_models_done_line_names_the_class_it_drew(weights, tmp_path, monkeypatch):
    """Issue 51 item 14: a class model's status line said "done: 2 image(s), 2 steps" without the class it drew."""
    monkeypatch.setenv("GRADIO_TEMP_DIR", str(tmp_path))
    h = Handlers(Engine(weights))
    name = h.engine.classes("tiny-classes")[1]
    last = _run(h.generate("tiny-classes", "ddim", 2, 0, 2, name, progress=lambda *a, **k: None))[-1]
    assert last[-1].startswith(f"done: 2 image(s) of class {name}, 2 steps"), last[-1]
    last = _run(h.generate("tiny-classes", "ddim", 2, 0, 2, "(any)", progress=lambda *a, **k: None))[-1]
    assert last[-1].startswith("done: 2 image(s), 2 steps"), last[-1]  # no class chosen: none named


JOBS = {"mean": ("Attention", "mean_attention_maps", "done: the maps of pixel"),
        "stats": ("Heads", "head_table", "done:")}


@pytest.mark.parametrize("job", list(JOBS))
def test_browser_a_job_pressed_right_after_its_stop_runs(server, monkeypatch, job):
    """The Stop-then-run race of Generate (issue 51 item 1) on the Attention tab's averaging and the Heads tab's
    statistics: a press 0.1 s after Stop did nothing (Gradio's page skips a click on a job it still counts as
    running). It is pressed again until it goes out (controls.retry_js), and its run ends with its done line."""
    import time
    from pathlib import Path

    from tests.app_browser import CHROMIUM, browser_page, type_number

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
    h = Handlers(Engine(weights))
    gen = h.engine.generate("tiny-classes", "ddim", steps=2, seed=0, num_images=1)
    skip = gr.skip()
    assert AttentionTab(h.engine, h.jobs).restage(gen, 0, 89, (1, 1), 0, 0) == (skip,) * 3
    assert AttentionTab(h.engine, h.jobs).refresh(gen, 0, 89, (1, 1), 0, 0) == (skip,) * 4
    assert AttentionTab(h.engine, h.jobs).refresh(gen, 3, 1, (1, 1), 0, 0) == (skip,) * 4  # an image of the generation before
    stages, text, heads = AttentionTab(h.engine, h.jobs).restage(gen, 0, 1, (1, 1), 0, 0)
    assert stages is not None and "step 1" in text


def test_a_job_stopped_while_it_waits_in_the_queue_says_it_never_started(weights):
    """Issue 60 item 1: a Generate waiting behind another job ("queue: 1/1") was dropped by Stop, and its status line
    fell back to the old "done: ..." with no word of a cancel."""
    import time
    from types import SimpleNamespace

    h = Handlers(Engine(weights))
    session = SimpleNamespace(session_hash="queued-session")
    h.jobs.requester("status")(session)  # Generate pressed: noted at once, before the queue hands it out
    time.sleep(0.6)  # it waits in the queue (QUEUED_S): a Generate pressed right after Stop is no cancelled one
    line = h.jobs.stopped("done: 4 image(s), 50 steps", session, "status")
    assert line.startswith("**cancelled before it started**: it was waiting for the job ahead of it")
    assert h.jobs.stopped("done: 4 image(s), 50 steps", session, "status") == "done: 4 image(s), 50 steps"  # said once
    h.jobs.requester("status")(session)
    with h.jobs.running(session, "status"):  # it started: a Stop then says where it stopped, as before
        h.jobs.requester("status")(session)  # a click repeated while it runs (retry_js) asks for nothing new
    time.sleep(0.6)
    assert h.jobs.stopped("denoising: step 3 / 50 · about 2 s left", session, "status").startswith("**stopped at step 3")
    h.jobs.requester("status")(session)  # pressed right after Stop: asked for after it, not cancelled by it
    assert h.jobs.stopped("denoising: step 3 / 50 · about 2 s left", session, "status").startswith("**stopped at step 3")

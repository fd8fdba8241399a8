"""The page's jobs (denoiser/app/jobs.py): what Stop's status line says of a job stopped while it ran, while it
waited in the queue, or after it had ended."""

from __future__ import annotations

import pytest

gr = pytest.importorskip("gradio")

from denoiser.app.attention_tab import AttentionTab  # noqa: E402
from denoiser.app.heads_tab import HeadsTab  # noqa: E402
from denoiser.app.jobs import Jobs  # noqa: E402
from tests.conftest import app_page  # noqa: E402


def _run(gen_fn):
    """Every update a generator handler yields, until it ends."""
    return list(gen_fn)


def test_stop_during_a_job_without_a_preview_does_not_speak_of_one(weights):
    """Issue 51 item 3: Stop during "average the maps over every step" or "Compute statistics" said "the preview is
    that step's predicted clean image (x₀)"; neither tab has a preview. The line each job shows while it runs, as Stop
    turns it into its stopped line (Jobs.stopped)."""
    page = app_page(weights)
    attention, heads = page.tab(AttentionTab), page.tab(HeadsTab)
    gen = page.engine.generate("tiny-classes", "ddim", steps=6, seed=0, num_images=1)
    quiet = dict(progress=lambda *a, **k: None)
    for updates, line, shown in ((_run(attention.mean_maps(gen, 0, (3, 4), **quiet)), attention.mean_status, "maps shown"),
                                 (_run(heads.head_stats(gen, 0, **quiet)), heads.stats_status, "charts and table shown")):
        running = [u[line] for u in updates[:-1] if isinstance(u.get(line), str)][0]
        stopped = Jobs._stopped_text(running)
        assert stopped.startswith("**stopped at step") and shown in stopped, stopped
        assert "preview" not in stopped and "x₀" not in stopped, stopped
    sampling = Jobs._stopped_text("denoising: step 3 / 50 · about 2 s left")  # Generate's keeps its preview
    assert "the preview is that step's predicted clean image (x₀)" in sampling


def test_a_job_stopped_while_it_waits_in_the_queue_says_it_never_started():
    """Issue 60 item 1: a Generate waiting behind another job ("queue: 1/1") was dropped by Stop, and its status line
    fell back to the old "done: ..." with no word of a cancel."""
    import time
    from types import SimpleNamespace

    jobs = Jobs()
    session = SimpleNamespace(session_hash="queued-session")
    jobs.requester("status")(session)  # Generate pressed: noted at once, before the queue hands it out
    time.sleep(0.6)  # it waits in the queue (QUEUED_S): a Generate pressed right after Stop is no cancelled one
    line = jobs.stopped("done: 4 image(s), 50 steps", session, "status")
    assert line.startswith("**cancelled before it started**: it was waiting for the job ahead of it")
    assert jobs.stopped("done: 4 image(s), 50 steps", session, "status") == "done: 4 image(s), 50 steps"  # said once
    jobs.requester("status")(session)
    with jobs.running(session, "status"):  # it started: a Stop then says where it stopped, as before
        jobs.requester("status")(session)  # a click repeated while it runs (retry_js) asks for nothing new
    time.sleep(0.6)
    assert jobs.stopped("denoising: step 3 / 50 · about 2 s left", session, "status").startswith("**stopped at step 3")
    jobs.requester("status")(session)  # pressed right after Stop: asked for after it, not cancelled by it
    assert jobs.stopped("denoising: step 3 / 50 · about 2 s left", session, "status").startswith("**stopped at step 3")

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


def test_stops_line_counts_from_the_click_not_from_its_queued_handler():
    """A fresh clone's make test (stop 67): Generate pressed 0.3 s before a second Stop, and the page's last line read
    "cancelled before it started", not "stopped at step". Stop's queued handler had started late on the busy
    machine, and its times counted from there, so the Generate looked as if it had waited QUEUED_S in the queue.
    They count from the click now (Jobs.halter notes it)."""
    import time
    from types import SimpleNamespace

    running = "stopped at step 3 / 50: the preview is that step's predicted clean image (x₀)"
    for gap, cancelled in ((0.0, False), (0.8, True)):  # the request this long before Stop's click
        jobs, session = Jobs(), SimpleNamespace(session_hash=f"late-{gap}")
        jobs.requester("status")(session)
        time.sleep(gap)
        jobs.halter("status")(session)  # Stop clicked
        time.sleep(0.8)  # its queued handler starts this late (QUEUED_S is 0.5)
        line = jobs.stopped(running, session, "status")
        assert line.startswith("**cancelled before it started**") == cancelled, (gap, line)


def test_a_job_left_by_its_cancel_stops_and_stop_says_so(monkeypatch):
    """Under load the page's Stop cancelled Gradio's task but sent the event id of the job before, so Gradio closed no
    generator (gradio 6.31 closes the one of that id): the worker sampled on unseen to the end, and Stop's line waited
    for the handler (the Photo tab's browser test in CI: "after Stop the status line says: 'edit: step 1 / 1000'").
    A handler nobody resumes for ORPHAN_S now stops its work at the next step, and Stop's line follows the work."""
    import time
    from types import SimpleNamespace

    import torch

    from denoiser.app import jobs as jobs_module
    from denoiser.app import streaming

    monkeypatch.setattr(streaming, "ORPHAN_S", 0.6)
    monkeypatch.setattr(jobs_module, "STOP_SETTLE_S", 0.0)
    jobs, session, steps = Jobs(), SimpleNamespace(session_hash="left"), []
    status = gr.Markdown(elem_id="status")  # the line (a component, as the page's; never drawn here)

    def job(on_step):  # 200 steps of 20 ms: 4 s if nobody stops it
        for i in range(200):
            time.sleep(0.02)
            steps.append(i)
            on_step(i, 200, torch.zeros(1, 3, 4, 4))
        return "done"

    handler = jobs.run(session, status, job, lambda *a, **k: None, "denoising")
    next(handler)  # the job runs; then nobody resumes its handler, and nobody closes it (the cancel missed it)
    pressed = time.monotonic()
    line = jobs.stopped("denoising: step 3 / 200 · about 4 s left", session, "status")
    waited = time.monotonic() - pressed
    assert line.startswith("**stopped at step 3 / 200**") and waited < 2.5, (line, waited)
    stopped_at = len(steps)
    time.sleep(0.3)
    assert 0 < stopped_at < 200 and len(steps) == stopped_at  # its work stopped well before its end, and stays stopped
    assert not jobs._is_running(("left", "status"))  # a new job of the line may start
    handler.close()  # Gradio's own close, later (a session dropped): the handler ends quietly


def test_stop_halts_the_sessions_job_on_its_line_at_the_click(monkeypatch):
    """Stop's unqueued listener (Jobs.halter) stops the work of the job running on its line for its session, at the
    click and whatever Gradio's cancel reaches; another session's job and another line's go on. Its handler waits a
    moment for the cancel to close it (STOP_GRACE_S), then ends by itself without a word (Stopped)."""
    import time
    from types import SimpleNamespace

    import torch

    from denoiser.app import streaming
    from denoiser.app.streaming import Stopped

    monkeypatch.setattr(streaming, "STOP_GRACE_S", 0.5)

    jobs = Jobs()
    counts = {"mine": [], "theirs": []}

    def job_of(name):
        def job(on_step):
            for i in range(100):
                time.sleep(0.02)
                counts[name].append(i)
                on_step(i, 100, torch.zeros(1, 3, 4, 4))
            return name

        return job

    mine, theirs = SimpleNamespace(session_hash="mine"), SimpleNamespace(session_hash="theirs")
    status = gr.Markdown(elem_id="status")
    handlers = {name: jobs.run(who, status, job_of(name), lambda *a, **k: None, "denoising")
                for name, who in (("mine", mine), ("theirs", theirs))}
    for handler in handlers.values():
        next(handler)
    jobs.halter("status")(mine)
    jobs.halter("other-status")(theirs)  # a Stop of another line: nothing of this one
    lines = []
    with pytest.raises(Stopped) as stopped:  # its handler, still resumed (the cancel missed it), ends at once
        for update in handlers["mine"]:
            lines.append(update.get(status))
    assert len(counts["mine"]) < 50 and not stopped.value.visible  # stopped well before its end; no toast
    assert not any("not done" in str(line) for line in lines)  # no word of its own: Stop's line says where it stopped
    assert list(handlers["theirs"])[-1] is not None and len(counts["theirs"]) == 100  # another session's ran on

"""The page's jobs (denoiser/app/jobs.py): Stop is one mark on the server that a running job reads at its next step and
a queued job reads when it starts, each writing its own line; a job waiting in the queue says its place and its wait.
Time is a clock the tests move (Jobs(clock=...)): nothing here sleeps."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

gr = pytest.importorskip("gradio")

import torch  # noqa: E402

from denoiser.app.attention_tab import AttentionTab  # noqa: E402
from denoiser.app.heads_tab import HeadsTab  # noqa: E402
from denoiser.app.jobs import CANCELLED, Jobs  # noqa: E402
from denoiser.request import SampleRequest  # noqa: E402
from tests.conftest import app_page  # noqa: E402

X0 = torch.zeros(1, 3, 4, 4)
API_DOORS = ("generate", "photo")  # the API endpoints on a hidden button of their own (sample_tab, photo_tab)
QUIET = dict(progress=lambda *a, **k: None)


class Clock:
    """A clock the test moves: Jobs reads it where it would read time.monotonic."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _session(name: str) -> SimpleNamespace:
    return SimpleNamespace(session_hash=name)


def _handler(jobs: Jobs, who, steps: int, during=None, line: str = "status"):
    """A job's handler of `steps` steps on status line `line` (`result = yield from jobs.run(...)`), as a tab's;
    `during(i)` runs before step i's UNet call. Returns (the handler, the steps done)."""
    status, done = gr.Markdown(elem_id=line), []

    def job(on_step):
        for i in range(steps):
            if during is not None:
                during(i)
            on_step(i, steps, X0)
            done.append(i)
        return "result"

    def handler():
        result = yield from jobs.run(who, status, job, QUIET["progress"], "denoising")
        if result is not None:
            yield {status: f"done: {result}"}

    return handler(), done, status


def _lines(handler, status) -> list:
    """Every status line a handler writes, to its end."""
    return [u[status] for u in handler if isinstance(u, dict) and isinstance(u.get(status), str)]


def test_stop_ends_the_running_job_at_its_next_step_and_the_job_says_where():
    """Stop's listener (Jobs.stopper, unqueued) marks the session's line; the running job stops at its next UNet call
    and writes its own "stopped at step k / N" as its last line, ending as an event that succeeded (no error: a
    click the page held back while it ran goes out then)."""
    jobs, me = Jobs(clock=Clock()), _session("me")
    said = []
    handler, done, status = _handler(jobs, me, 100, during=lambda i: i == 3 and said.append(jobs.stopper("status")(me)))
    lines = _lines(handler, status)  # ends without raising
    assert said == [gr.skip()]  # Stop's listener writes nothing over the running job's line
    assert done == [0, 1, 2], done  # the step in progress at Stop ran; none after it
    assert lines[-1].startswith("**stopped at step 3 / 100**") and "x₀" in lines[-1], lines
    assert not any(line.startswith("done") for line in lines)


def test_stop_halts_only_its_own_session_and_line():
    """Another session's Stop, and this session's Stop of another line, leave a job running to its end."""
    jobs, me = Jobs(clock=Clock()), _session("me")

    def others_stop(i):
        if i == 5:
            jobs.stopper("status")(_session("someone else"))
            jobs.stopper("photo-status")(me)

    handler, done, status = _handler(jobs, me, 20, during=others_stop)
    assert _lines(handler, status)[-1] == "done: result" and len(done) == 20


def test_a_job_stopped_while_it_waits_in_the_queue_says_it_was_cancelled():
    """Issue 60 item 1: a Generate waiting behind another job was dropped by Stop without a word. Its click is noted
    at once (Jobs.requester, unqueued); a Stop after the click marks it, and the job, when its turn comes, says it was
    cancelled and runs nothing. Stop's own listener says so at the click, not once the job ahead has ended."""
    clock = Clock()
    jobs, me = Jobs(clock=clock), _session("me")
    jobs.requester("status")(me)
    clock.now = 1.0
    assert jobs.stopper("status")(me) == CANCELLED
    clock.now = 30.0  # its turn comes
    handler, done, status = _handler(jobs, me, 10)
    assert _lines(handler, status) == [CANCELLED] and done == []
    # the next click is a new request: it runs, whatever Stop came before it
    clock.now = 31.0
    jobs.requester("status")(me)
    handler, done, status = _handler(jobs, me, 10)
    assert _lines(handler, status)[-1] == "done: result" and len(done) == 10


def test_a_click_right_after_stop_runs():
    """Issue 51 item 1: Generate pressed right after Stop ran nothing. Its click comes after the Stop's mark, so its job
    runs once the stopped one has ended (the page sends it then: trigger mode "always_last")."""
    clock = Clock()
    jobs, me = Jobs(clock=clock), _session("me")
    pressed = []

    def stop_then_press(i):
        if i == 4:
            jobs.stopper("status")(me)
            clock.now += 0.01
            pressed.append(jobs.requester("status")(me))  # while the stopped job still runs its step

    handler, done, status = _handler(jobs, me, 50, during=stop_then_press)
    assert _lines(handler, status)[-1].startswith("**stopped at step 4 / 50**")
    assert pressed == [gr.skip()]  # the session's own job runs on this line: no queue line over its progress
    handler, done, status = _handler(jobs, me, 5)
    assert _lines(handler, status)[-1] == "done: result" and len(done) == 5


def test_a_second_stop_drops_a_click_that_was_held_back():
    """Stop, Generate at once (held back by the page while the stopped job ends), Stop again: the second Stop is
    for that Generate, which says it was cancelled when it is sent."""
    clock = Clock()
    jobs, me = Jobs(clock=clock), _session("me")

    def stop_press_stop(i):
        if i == 4:
            for act in (jobs.stopper, jobs.requester, jobs.stopper):
                clock.now += 0.1
                act("status")(me)

    handler, _, status = _handler(jobs, me, 50, during=stop_press_stop)
    assert _lines(handler, status)[-1].startswith("**stopped at step 4 / 50**")
    jobs.requester("status")(me)  # the page sends the held-back click (its listeners again) once the job has ended
    handler, done, status = _handler(jobs, me, 5)
    assert _lines(handler, status) == [CANCELLED] and done == []


def test_a_waiting_job_says_its_place_and_a_wait_from_the_speed_of_the_jobs_ahead():
    """Issue 72 item 1: a job waiting behind a 150-step Generate showed nothing, then Gradio's "queue: 1/1 |
    6.2/4.8s" for a wait of ~80 s. Its line now says its place and the running job's time left at that job's own
    measured speed; a job waiting ahead counts as long as the recent jobs took."""
    clock = Clock()
    jobs, first, second, third = Jobs(clock=clock), _session("first"), _session("second"), _session("third")
    said = {}

    def step(i):  # each UNet call takes 0.5 s; two visitors press Generate at step 40
        if i == 40:
            said["second"] = jobs.requester("status")(second)
            said["third"] = jobs.requester("status")(third)
        clock.now += 0.5

    assert jobs.requester("status")(first) == gr.skip()  # nothing ahead: no queue line; its own comes at once
    handler, _, status = _handler(jobs, first, 150, during=step)
    _lines(handler, status)
    # at step 40 of 150, 20 s in: 110 steps left at 0.5 s each
    assert said["second"].startswith("**waiting in the queue**: 1 job ahead") and "about 55 s" in said["second"]
    assert "2 jobs ahead" in said["third"]  # its wait: the first's time left, then the second's turn, not yet timed
    assert "more than 55 s" in said["third"], said["third"]
    clock.now += 1
    assert jobs.queue_line(("third", "status")).startswith("**waiting in the queue**: 1 job ahead")
    assert "about 75 s" in jobs.queue_line(("third", "status"))  # the first job took 75 s: so will the second


def test_a_waiting_jobs_line_counts_down_and_its_timer_stops_once_it_runs():
    """Issue 72: the queue line was said once, at the click: a wait of 55 s still read 55 s a minute later. Each tick of
    the line's timer (Jobs.ticker, every TICK_S) says it again from the running job's progress; once the job starts,
    or was stopped while it waited, the tick leaves the line to the job and the timer stops."""
    clock = Clock()
    jobs, first, second, third = Jobs(clock=clock), _session("first"), _session("second"), _session("third")
    ticks = {}

    def step(i):  # each UNet call takes 0.5 s; two visitors press Generate at step 40
        if i == 40:
            jobs.requester("status")(second)
            jobs.requester("status")(third)
            jobs.stopper("status")(third)  # the third changes its mind while it waits
        if i in (40, 100):
            ticks[i] = jobs.ticker("status")(second), jobs.ticker("status")(third)
        clock.now += 0.5

    handler, _, status = _handler(jobs, first, 150, during=step)
    _lines(handler, status)
    (said_40, timer_40), (cancelled, stopped_timer) = ticks[40]
    (said_100, timer_100), _ = ticks[100]
    assert "about 55 s" in said_40 and "about 25 s" in said_100, (said_40, said_100)  # 110, then 50 steps left
    assert timer_40.active is True and timer_100.active is True
    assert cancelled == gr.skip() and stopped_timer.active is False  # the stopped one keeps its "cancelled" line
    running = _handler(jobs, second, 2, during=lambda i: ticks.setdefault("own", jobs.ticker("status")(second)))
    _lines(*running[::2])
    shown, timer = ticks["own"]
    assert shown == gr.skip() and timer.active is False  # its own job writes its line now


def test_a_handler_closed_by_its_client_frees_its_line():
    """An API client's cancel (or a closed tab) closes the handler: its work stops at its next step and its line is
    free."""
    import threading

    jobs, me = Jobs(clock=Clock()), _session("me")
    reached, gate = threading.Event(), threading.Event()
    handler, done, status = _handler(jobs, me, 1000, during=lambda i: i == 2 and (reached.set(), gate.wait(30)))
    next(handler)
    assert reached.wait(30)
    halt = jobs._running[("me", "status")].halt
    closer = threading.Thread(target=handler.close)  # it waits for the worker (joined before the slot frees)
    closer.start()
    assert halt.wait(30)  # the close has told the work to stop
    gate.set()
    closer.join(30)
    assert not closer.is_alive() and done == [0, 1], done
    assert ("me", "status") not in jobs._running
    handler, done, status = _handler(jobs, me, 3)
    assert _lines(handler, status)[-1] == "done: result"


def test_stop_during_a_job_without_a_preview_does_not_speak_of_one(weights):
    """Issue 51 item 3: Stop during "average the maps over every step" or "Compute statistics" said "the preview is
    that step's predicted clean image (x₀)"; neither tab has a preview. The line each job shows while it runs, as Stop
    turns it into its stopped line (Jobs._stopped_text)."""
    page = app_page(weights)
    attention, heads = page.tab(AttentionTab), page.tab(HeadsTab)
    gen = page.engine.generate("tiny-classes", SampleRequest(scheduler="ddim", steps=6, seed=0, num_images=1))
    for updates, line, shown in ((list(attention.mean_maps(gen, 0, (3, 4), **QUIET)), attention.mean_status, "maps shown"),
                                 (list(heads.head_stats(gen, 0, **QUIET)), heads.stats_status, "charts and table shown")):
        running = [u[line] for u in updates[:-1] if isinstance(u.get(line), str) and "step" in u[line]][0]
        stopped = Jobs._stopped_text(running)
        assert stopped.startswith("**stopped at step") and shown in stopped, stopped
        assert "preview" not in stopped and "x₀" not in stopped, stopped
    sampling = Jobs._stopped_text("denoising: step 3 / 50 · about 2 s left")  # Generate's keeps its preview
    assert "the preview is that step's predicted clean image (x₀)" in sampling
    assert Jobs._stopped_text("denoising: starting").startswith("**stopped before its first step**")


def test_every_job_handler_is_given_its_session(demo):
    """Stop finds a job by its session: every job of the sampling slot is a handler Gradio passes the gr.Request (it
    reads the handler's type hints; a functools.partial has none, and its job ran as nobody's: Stop missed it)."""
    from gradio.utils import get_type_hints

    jobs = [fn for fn in demo.fns.values() if fn.concurrency_id == "sampling"]
    assert len(jobs) >= 6, [fn.name for fn in jobs]  # Generate, its API, a "try these" row, the word edit, Photo, ...
    for fn in jobs:
        assert gr.Request in get_type_hints(fn.fn).values(), f"{fn.name} is not given the gr.Request"


def test_every_job_a_person_starts_is_noted_first(demo):
    """A job waits in the queue with its place on its status line, and a Stop while it waits cancels it, only if its
    click was noted first (Jobs.requester: the page runs a click's listeners, and a chain's steps, in order). Every
    job of the sampling slot a person starts (a button, a "try these" row) is; the hidden buttons of the /generate and
    /photo APIs (API_DOORS) are no person's. Before, a row's run waiting in the queue showed nothing once Gradio's tracker was hidden."""
    fns = demo.fns
    noted = {fn._id: fn for fn in fns.values() if fn.name == "requested"}
    assert any(fn.concurrency_id == "sampling" and fn.trigger_after is not None for fn in fns.values())  # a row's run
    for fn in fns.values():
        if fn.concurrency_id != "sampling" or fn.api_name in API_DOORS:
            continue
        if fn.trigger_after is not None:
            assert fn.trigger_after in noted, f"{fn.name} (after {fns[fn.trigger_after].name}) is not noted first"
        else:
            first = [n for n in noted.values() if n.targets == fn.targets and n._id < fn._id]
            assert first, f"{fn.name} on {fn.targets} is not noted first"
    assert all(fn.show_progress == "hidden" and fn.trigger_mode == "always_last"
               for fn in fns.values() if fn.concurrency_id == "sampling" and fn.api_name not in API_DOORS)

"""The jobs a page runs, by session and status line: which one runs now, which was asked for and is still waiting in
the queue, which has ended. Stop's handler (`Jobs.stopper`) reads them to write the status line after a Stop: where the
job stopped, that it was cancelled before it started, or nothing when the job it meant has already written its line.
Every tab's long job (Generate, the word edit, the Photo tab's Run, the Attention tab's averaging, the Heads tab's
statistics and switch) notes itself here.
"""

from __future__ import annotations

import contextlib
import re
import threading
import time

import gradio as gr

from denoiser.app.engine import RESTORE_OPERATIONS
from denoiser.app.streaming import not_started, relay, stream, user_error

__all__ = ["Jobs", "RUNNING"]

STOP_SETTLE_S = 0.5  # after Stop, the status line is written this long after the cancel
QUEUED_S = 0.5  # a job asked for at least this long before Stop and not started since was waiting in the queue (a
# Generate pressed right after Stop, retry_js's, is asked for after it: not a cancelled one)
STOP_WAIT_S = 30  # ... or once the stopped job has ended, at most this long after Stop (controls.retry_js waits for it)
RUNNING = ("denoising", "averaging", "measuring", "switching off", *RESTORE_OPERATIONS)  # the status line's first word while a job runs (streaming.progress_text)
# after Stop, what the jobs without a preview leave shown (Attention's "average the maps", Heads' statistics)
STOPPED_SHOWS = {"averaging": "nothing was averaged; the maps shown are of the step chosen",
                 "denoise (tiles)": "the preview shows the tiles denoised so far, not a result; the results shown are "
                                    "from the run before",
                 "measuring": "nothing was measured; the charts and table shown are from before, if any"}
MARKS_KEPT = 1000  # sessions whose last job's end Jobs remembers (for Stop's line: Jobs.stopped)


class Jobs:
    """The job bookkeeping of one page (every session's), for Stop's status line."""

    def __init__(self) -> None:
        self._finished: dict[tuple[str, str], float] = {}  # (session, status line) -> when its latest job ended
        # (session, status line) of the jobs running now -> (set once the job's work has ended, which may come before
        # its handler ends: a handler left by a cancel that closed no generator; set to stop its work: halter)
        self._running: dict[tuple[str, str], tuple[threading.Event, threading.Event]] = {}
        self._requested: dict[tuple[str, str], float] = {}  # (session, status line) -> when a job not started was asked
        self._stop_pressed: dict[tuple[str, str], float] = {}  # (session, status line) -> when Stop was last clicked
        self._lock = threading.Lock()

    def requester(self, line: str):
        """A job button's unqueued listener: this session asked for the job of status line `line` (it may wait in the
        queue behind another job; a Stop before it starts says it was cancelled before it started: stopped)."""

        def requested(request: gr.Request) -> None:
            key = (getattr(request, "session_hash", None) or "", line)
            # a click repeated while its job runs (retry_js presses again after a Stop; the page skips the job's
            # second start) asks for nothing new
            if key[0] and not self._is_running(key):
                self._requested[key] = time.monotonic()

        return requested

    def refuse(self, request: gr.Request | None, status, err: Exception):
        """A job refused before any work (`yield from jobs.refuse(...)` in its handler): its status line says why, the
        rest of the page stays as it is, and the error goes on (the page's toast; an API caller's exception)."""
        error = user_error(err)
        self.finished(request, status.elem_id)
        yield {status: not_started(error.message)}
        raise error from None

    def run(self, request: gr.Request | None, status, job, progress, what: str, preview=None, show=None,
            unit: str = "step"):
        """`job(on_step)` as this session's job on the status line `status` (`result = yield from jobs.run(...)`):
        in a worker thread (streaming.stream), its progress on the line, its previews shown on `preview`; returns its
        result. The handler then yields its last update through `done`."""
        ended, stop = threading.Event(), threading.Event()

        def work(on_step):
            try:
                return job(on_step)
            finally:
                ended.set()  # the work has stopped: Stop's line need not wait for the handler (stopped)

        with self.running(request, status.elem_id, (ended, stop)):
            return (yield from relay(stream(work, progress, what, unit, stop), status, preview, show))

    @contextlib.contextmanager
    def running(self, request: gr.Request | None, line: str, events: tuple | None = None):
        """A job of this session on the status line `line` runs inside (until its worker has stopped: stream);
        `events`: (set once its work has ended, which can come first; set to stop it), as Jobs.run makes them."""
        key = (getattr(request, "session_hash", None) or "", line)
        events = events or (threading.Event(), threading.Event())
        self._requested.pop(key, None)
        self._running[key] = events
        try:
            yield
        finally:
            events[0].set()
            if self._running.get(key) is events:  # a later job of the line has an entry of its own
                del self._running[key]

    def _is_running(self, key: tuple[str, str]) -> bool:
        events = self._running.get(key)
        return events is not None and not events[0].is_set()

    def halter(self, line: str):
        """A Stop button's unqueued listener: the job of this session running on the status line `line` stops its work
        at its next step, whatever Gradio's cancel does (under load the page's cancel can name the job before: it
        then cancels Gradio's task but closes no generator, and the work went on unseen). Unqueued, it acts at the
        click, before a job pressed after the Stop can start. It notes when Stop was clicked, for Stop's line (stopped)."""

        def halt(request: gr.Request) -> None:
            key = (getattr(request, "session_hash", None) or "", line)
            if key[0]:
                self._mark(self._stop_pressed, key)
            events = self._running.get(key)
            if events is not None:
                events[1].set()

        return halt

    def done(self, request: gr.Request | None, status, update: dict) -> dict:
        """A job's last update, with its done line on `status` (`yield jobs.done(request, status, {...})`): built
        first (its files written), then the job noted finished (`finished`), so nothing lies between the two, and a
        Stop pressed from then on writes nothing over the line."""
        self.finished(request, status.elem_id)
        return update

    def finished(self, request: gr.Request | None, line: str) -> None:
        """A job of this session writes its last line on `line` (a status line's elem_id: done, or why it did not
        start): a Stop pressed before it no longer writes that line (stopped)."""
        if request is None or not getattr(request, "session_hash", None):
            return
        self._requested.pop((request.session_hash, line), None)
        self._mark(self._finished, (request.session_hash, line))

    def _mark(self, marks: dict[tuple[str, str], float], key: tuple[str, str]) -> None:
        """`marks[key]` = now, as the newest entry; the oldest dropped past MARKS_KEPT."""
        with self._lock:
            marks.pop(key, None)
            marks[key] = time.monotonic()
            while len(marks) > MARKS_KEPT:
                marks.pop(next(iter(marks)))

    def stopper(self, line: str):
        """Stop's handler for the status line `line` (stopped)."""

        def stop(status: str | None, request: gr.Request) -> str:
            return self.stopped(status, request, line)

        return stop

    def stopped(self, status: str | None, request: gr.Request | None = None, line: str = "status"):
        """The status line `line` after Stop, written once the cancel has reached the page; untouched when a job of
        this session has ended on it since Stop was pressed (Generate pressed right after Stop, a short run: its line
        is the new run's). A job still running then writes its progress over this line at its next step.

        Times count from Stop's click (halter notes it), not from this handler's start: under load the queue starts
        it seconds later, and a Generate pressed 0.3 s before a second Stop then looked as if it had waited in the
        queue for long ("cancelled before it started" written over "stopped at step")."""
        session = getattr(request, "session_hash", None)
        now = time.monotonic()
        clicked = self._stop_pressed.get((session or "", line), 0.0)
        pressed = clicked if now - clicked < STOP_WAIT_S else now  # no click noted (an API call): from now
        time.sleep(STOP_SETTLE_S)  # the cancel reaches the page first: this line comes after its state
        while self._is_running((session or "", line)) and time.monotonic() - pressed < STOP_WAIT_S:
            time.sleep(0.05)  # the stopped job ends after its UNet call: the page presses a waiting Generate after this
        if session and self._finished.get((session, line), 0.0) > pressed:
            return gr.skip()
        asked = self._requested.get((session or "", line))
        if asked is not None and asked < pressed - QUEUED_S:  # asked for before Stop, still waiting: Stop dropped it
            self._requested.pop((session or "", line), None)
            return ("**cancelled before it started**: it was waiting for the job ahead of it (one job runs at a time); "
                    "the results shown are from the run before, if any")
        return Jobs._stopped_text(status)

    @staticmethod
    def _stopped_text(status: str | None) -> str:
        """The status line after Stop: where the job stopped, and what the pictures shown are (a sampling job's
        preview is the step's predicted x₀; the Attention tab's averaging and the Heads tab's statistics have no
        preview: their maps or charts are from before)."""
        match = re.search(r"(step|tile) (\d+) / (\d+)", status or "")
        if match is None or not str(status).startswith(tuple(RUNNING)):
            return status or ""  # nothing was running
        unit, k, n = match.groups()
        shown = STOPPED_SHOWS.get(str(status).split(":")[0], "the preview is that step's predicted clean image (x₀), "
                                                              "not a result; the results shown are from the run before")
        return f"**stopped at {unit} {k} / {n}**: {shown}"


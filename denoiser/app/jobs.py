"""The long jobs of one page (every session's), which share one sampling slot: which runs now, which wait in the queue
for it, and Stop.

Stop is one mark on the server. The Stop button's listener (unqueued: it acts at the click) halts the session's job on
its status line: a running job ends at its next UNet call and writes its own "stopped at step k / N"; a job still
waiting in the queue finds the mark when it starts and says it was cancelled. A job ends as an event that succeeded,
so a click the page held back while it ran (the job's trigger mode "always_last", denoiser.app.controls) goes out then.

A job's click notes itself at once (`requester`, unqueued), so a job waiting in the queue says on its status line its
place and a wait estimated from the measured speed of the jobs ahead (`queue_line`), said again every TICK_S seconds
while it waits (`ticker`), so the wait counts down. Every tab's long job (Generate,
the word edit, the Photo tab's Run, the Attention tab's averaging, the Heads tab's statistics and switch) runs here.
"""

from __future__ import annotations

import re
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import gradio as gr

from denoiser.app.engine import RESTORE_OPERATIONS
from denoiser.app.streaming import Stopped, not_started, relay, stream, user_error

__all__ = ["CANCELLED", "Jobs", "RUNNING", "TICK_S"]

RUNNING = ("denoising", "averaging", "measuring", "switching off", *RESTORE_OPERATIONS)  # the status line's first word while a job runs (streaming.progress_text)
# after Stop, what the jobs without a preview leave shown (Attention's "average the maps", Heads' statistics)
STOPPED_SHOWS = {"averaging": "nothing was averaged; the maps shown are of the step chosen",
                 "denoise (tiles)": "the preview shows the tiles denoised so far, not a result; the results shown are "
                                    "from the run before",
                 "measuring": "nothing was measured; the charts and table shown are from before, if any"}
CANCELLED = ("**cancelled before it started**: it was waiting for the job ahead of it (one job runs at a time); "
             "the results shown are from the run before, if any")
MARKS_KEPT = 1000  # (session, status line) marks kept, oldest dropped first: a page's memory stays bounded
TIMES_KEPT = 20  # the latest jobs' durations, for the wait of a job still waiting ahead (queue_line)
TICK_S = 2.0  # a waiting job's line is said again this often (`ticker`): its wait counts down

Key = tuple[str, str]  # (session, status line's elem_id)


@dataclass
class _Running:
    """A job that runs now: its halt (set by Stop) and how far it is, for the wait of the jobs behind it."""

    started: float
    halt: threading.Event = field(default_factory=threading.Event)
    done: int = 0  # steps (or tiles) done
    total: int = 0

    def left(self, now: float) -> float | None:
        """Seconds left at this job's own measured speed; None before its first step."""
        if self.done == 0:
            return None
        return (now - self.started) / self.done * (self.total - self.done)


def _key(request: gr.Request | None, line: str) -> Key:
    return (getattr(request, "session_hash", None) or "", line)


def _seconds(s: float) -> str:
    return f"{s:.0f} s" if s < 90 else f"{s / 60:.0f} min"


class Jobs:
    """The job bookkeeping of one page (every session's). `clock`: seconds, monotonic (a test passes its own)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._asked: dict[Key, float] = {}  # a click whose job has not started -> when (the earliest such click)
        self._stopped: dict[Key, float] = {}  # when Stop was last pressed
        self._running: dict[Key, _Running] = {}
        self._took: deque[float] = deque(maxlen=TIMES_KEPT)  # seconds each recent job ran, start to end
        self._lock = threading.Lock()

    def requester(self, line: str):
        """A job button's unqueued listener, before the job's own (the page runs a click's listeners in order): this
        session asked for the job of status line `line`. Returns the line while it waits (queue_line), or leaves it
        (gr.skip) when the slot is free or the session's own job of the line runs (the page sends the click once that
        one has ended)."""

        def requested(request: gr.Request):
            key = _key(request, line)
            if not key[0]:
                return gr.skip()
            with self._lock:
                self._mark(self._asked, key, keep=True)
                own = key in self._running
            return gr.skip() if own else self.queue_line(key)

        return requested

    def ticker(self, line: str):
        """The listener of a status line's timer (`TICK_S`, started by each click, denoiser.app.controls.queued):
        while this session's job of `line` waits in the queue, its queue line again, the wait counted down from the
        running job's progress; once the job has started, was stopped or ended, nothing, and the timer stops."""

        def tick(request: gr.Request):
            key = _key(request, line)
            with self._lock:
                asked = self._asked.get(key)
                waiting = bool(key[0]) and asked is not None and key not in self._running and not self._stopped_since(key, asked)
            said = self.queue_line(key) if waiting else gr.skip()
            return said, gr.Timer(active=isinstance(said, str))

        return tick

    def queue_line(self, key: Key) -> str | dict:
        """The status line of the job `key` asked for while it waits: its place (the jobs running and those asked for
        before it) and the wait, from the running job's own speed and the recent jobs' times; gr.skip() when nothing
        is ahead of it."""
        now = self._clock()
        with self._lock:
            running = list(self._running.values())
            asked = list(self._asked)  # in the order of the clicks
            ahead = asked[:asked.index(key)] if key in asked else asked
            waiting = sum(1 for k in ahead if k not in self._running)
            took = list(self._took)
        if not running and not waiting:
            return gr.skip()
        typical = sum(took) / len(took) if took else None  # a job waiting ahead: as long as the recent ones took
        parts = [0.0 if job.halt.is_set() else job.left(now) for job in running] + [typical] * waiting
        wait = sum(s for s in parts if s is not None)
        if None not in parts:
            when = f"it starts in about {_seconds(wait)}"
        elif wait:
            when = f"it starts in more than {_seconds(wait)} (a job ahead has not measured its speed yet)"
        else:
            when = "its wait is said once the job ahead has measured its speed"
        jobs = "1 job" if len(parts) == 1 else f"{len(parts)} jobs"
        return f"**waiting in the queue**: {jobs} ahead of this one (one job runs at a time); {when}"

    def stopper(self, line: str):
        """A Stop button's unqueued listener: the session's job on the status line `line` stops (this module's
        docstring). A running job writes its own line; of a job still waiting in the queue, the line says at once
        that it is cancelled (it says so again when its turn comes, and runs nothing)."""

        def stop(request: gr.Request):
            key = _key(request, line)
            if not key[0]:
                return gr.skip()
            with self._lock:
                self._mark(self._stopped, key)
                job = self._running.get(key)
                waiting = key in self._asked
            if job is not None:
                job.halt.set()
                return gr.skip()
            return CANCELLED if waiting else gr.skip()

        return stop

    def _starts(self, key: Key) -> bool:
        """The job of `key` starts: its click's note is done with; False when a Stop came after that click (it waited
        in the queue and was stopped there). A job with no note (an API call) starts."""
        with self._lock:
            asked = self._asked.pop(key, None)
            return asked is None or not self._stopped_since(key, asked)

    def _stopped_since(self, key: Key, asked: float) -> bool:
        """Whether Stop was pressed on `key`'s line after its click at `asked`. Called under the lock."""
        return self._stopped.get(key, float("-inf")) >= asked

    def refuse(self, request: gr.Request | None, status, err: Exception):
        """A job refused before any work (`yield from jobs.refuse(...)` in its handler): its status line says why, the
        rest of the page stays as it is, and the error goes on (the page's toast; an API caller's exception)."""
        error = user_error(err)
        self.finished(request, status.elem_id)
        yield {status: not_started(error.message)}
        raise error from None

    def run(self, request: gr.Request | None, status, job, progress, what: str, preview=None, show=None,
            unit: str = "step", stopped: dict | None = None):
        """`job(on_step)` as this session's job on the status line `status` (`result = yield from jobs.run(...)`): in a
        worker thread (streaming.stream), its progress on the line, its previews shown on `preview`; returns its
        result, or None when it was stopped or cancelled in the queue: it has then written its line (and `stopped`'s
        updates, e.g. a preview's label), and the handler returns. Otherwise the handler yields its last update
        through `done`."""
        key = _key(request, status.elem_id)
        if not self._starts(key):
            yield {status: CANCELLED}
            return None
        running = _Running(started=self._clock())
        with self._lock:
            self._running[key] = running

        def work(on_step):
            def step(i: int, total: int, x0) -> None:
                on_step(i, total, x0)  # raises once halted: the job ends after the UNet call in progress
                running.done, running.total = i + 1, total

            return job(step)

        try:
            result = yield from relay(stream(work, progress, what, unit, running.halt), status, preview, show)
        except Stopped as stop:
            yield {status: self._stopped_text(stop.status), **(stopped or {})}
            return None
        finally:
            with self._lock:
                if self._running.get(key) is running:
                    del self._running[key]
        self._took.append(self._clock() - running.started)  # a whole job's time: the wait of one waiting ahead
        return result

    def done(self, request: gr.Request | None, status, update: dict) -> dict:
        """A job's last update, with its done line on `status` (`yield jobs.done(request, status, {...})`)."""
        self.finished(request, status.elem_id)
        return update

    def finished(self, request: gr.Request | None, line: str) -> None:
        """A job of this session writes its last line on `line` without running (done, or why it did not start): its
        click's note is done with."""
        with self._lock:
            self._asked.pop(_key(request, line), None)

    def _mark(self, marks: dict[Key, float], key: Key, keep: bool = False) -> None:
        """`marks[key]` = now, as the newest entry (`keep`: unless it has one already, which keeps its time and
        place); the oldest dropped past MARKS_KEPT. Called under the lock."""
        if keep and key in marks:
            return
        marks.pop(key, None)
        marks[key] = self._clock()
        while len(marks) > MARKS_KEPT:
            marks.pop(next(iter(marks)))

    @staticmethod
    def _stopped_text(status: str | None) -> str:
        """The status line after Stop: where the job stopped, and what the pictures shown are (a sampling job's
        preview is the step's predicted x₀; the Attention tab's averaging and the Heads tab's statistics have no
        preview: their maps or charts are from before)."""
        match = re.search(r"(step|tile) (\d+) / (\d+)", status or "")
        if match is None or not str(status).startswith(tuple(RUNNING)):
            return "**stopped before its first step**: the results shown are from the run before, if any"
        unit, k, n = match.groups()
        shown = STOPPED_SHOWS.get(str(status).split(":")[0], "the preview is that step's predicted clean image (x₀), "
                                                              "not a result; the results shown are from the run before")
        return f"**stopped at {unit} {k} / {n}**: {shown}"

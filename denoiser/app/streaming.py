"""Running a sampling job for a page: in a worker thread, with previews and progress, stoppable.

`stream(job, progress, desc)` runs `job(on_step)` in a thread and yields (x0 preview, progress text) while it
runs; `relay` turns those into a handler's updates; `user_error` turns any failure into a short message
without traceback or server paths. The page's Stop (its `stop` event: denoiser.app.jobs) ends the work at its next
step and the stream with `Stopped`; closing the consumer (a closed tab, an API client's cancel) stops the worker the
same way. Either way the worker is joined before the queue slot frees. `STOPPING` is set once by
Ctrl-C or SIGTERM: running jobs then stop at their next step, so no sampling thread is in C++ when Python
exits.
"""

from __future__ import annotations

import functools
import html
import logging
import queue
import threading
import time

import gradio as gr

from denoiser.fast import malloc
from denoiser.folders.model_dir import model_roots
from denoiser.image_io import to_pil

__all__ = ["STOPPING", "Cancelled", "Stopped", "progress_text", "stream", "relay", "user_error", "not_started", "friendly"]

log = logging.getLogger("denoiser.app")
HEARTBEAT_S = 0.5  # longest wait between yields of a running generation (how soon a client's cancel is seen)
PREVIEW_EVERY_S = 1.5  # at least this often a preview while sampling (DDPM-1000 never looks frozen)
STOPPING = threading.Event()


class Cancelled(Exception):
    """Raised inside the sampling loop's callback once the request that started it is gone."""


class Stopped(Exception):
    """A job's work stopped by the page's Stop (its `stop` event set) at a step: `status` is its last progress line
    ("denoising: step 12 / 50 · ..."; None before its first step), from which its handler says where it stopped."""

    def __init__(self, status: str | None) -> None:
        super().__init__(status)
        self.status = status


def progress_text(desc: str, done: int, total: int, elapsed: float, unit: str = "step") -> str:
    """ "sampling: step 12 / 50 · about 8 s left" (the rest estimated from this job's steps so far); unit "tile" for a
    photo denoised in tiles: "denoise (tiles): tile 640 / 2,961 · ..."."""
    left = elapsed / max(done, 1) * (total - done)
    when = f"about {left:.0f} s left" if left < 120 else f"about {left / 60:.0f} min left"
    return f"{desc}: {unit} {done} / {total} · {when}" if done < total else f"{desc}: {unit} {done} / {total}"


class _Worker:
    """One job in its own thread: its previews in a queue, its latest progress line, its result or error."""

    def __init__(self, job, progress, desc: str, unit: str = "step", stop: threading.Event | None = None) -> None:
        self.job, self.progress, self.desc, self.unit = job, progress, desc, unit
        self.previews: queue.Queue = queue.Queue()  # x0 previews, then None when the job has ended
        self.result: dict = {}
        self.stop = stop or threading.Event()  # set by the page's Stop, or when nobody listens any more
        self.started = self.last_preview = time.monotonic()  # DDPM-1000 still shows a fresh x0 every PREVIEW_EVERY_S
        self.status: str | None = None  # the latest "step k / N · about S s left"
        self.shown: str | None = None  # the status line the page shows now
        self.thread = threading.Thread(target=self._work, name="denoiser-generate", daemon=True)

    def on_step(self, i: int, total: int, x0) -> None:
        if self.stop.is_set() or STOPPING.is_set():
            raise Cancelled  # out of the sampling loop after the UNet call in progress
        self.status = progress_text(self.desc, i + 1, total, time.monotonic() - self.started, self.unit)
        self.progress((i + 1) / total, desc=self.status)
        now = time.monotonic()
        if i % max(1, total // 10) == 0 or i == total - 1 or now - self.last_preview > PREVIEW_EVERY_S:
            self.last_preview = now
            self.previews.put(x0)

    def _work(self) -> None:
        try:
            self.result["value"] = self.job(self.on_step)
        except Cancelled:
            pass
        except Exception as err:  # noqa: BLE001 - every failure reaches the user as a readable message
            self.result["error"] = err
        finally:
            self.previews.put(None)

    def fresh_status(self) -> str | None:
        """The progress line if it changed since last asked, else None."""
        new = self.status if self.status != self.shown else None
        self.shown = self.status
        return new


def stream(job, progress, desc: str, unit: str = "step", stop: threading.Event | None = None):
    """Run `job(on_step)` (a generation or an edit) in a worker thread; yield (x0 preview, progress text) as they
    come (None for what has not changed, at least every HEARTBEAT_S), then return its result. `stop` set (the page's
    Stop: denoiser.app.jobs), the worker stops at its next step and this raises Stopped; when the consumer is closed (a
    closed tab, an API client's cancel), the worker stops the same way. It is joined first either way, so the queue
    slot frees only once the work has stopped."""
    worker = _Worker(job, progress, desc, unit, stop)
    progress(0, desc=f"{desc}: starting")
    worker.thread.start()
    try:
        # this job's own line at once, over its queue line (a model's first step can take seconds)
        yield None, f"{desc}: starting"
        while True:
            try:
                x0 = worker.previews.get(timeout=HEARTBEAT_S)
            except queue.Empty:  # yield now and then: a cancel can only close a generator at a yield
                yield None, worker.fresh_status()
                continue
            if x0 is None:
                break
            yield to_pil(x0), worker.fresh_status()
    finally:
        worker.stop.set()
        worker.thread.join()
        # the job's activations and the generations of sessions dropped since are free now: hand them back,
        # or glibc keeps them and the server's RSS stays at its highest (tests/app/test_app.py)
        malloc.release_free_memory()
    if "error" in worker.result:
        raise user_error(worker.result["error"])
    if "value" not in worker.result and not STOPPING.is_set():  # stopped by the page's Stop
        raise Stopped(worker.status)
    if "value" not in worker.result:  # cancelled while the request still listens: the server is stopping
        raise gr.Error("the server is shutting down: try again once it is back")
    return worker.result["value"]


def user_error(err: BaseException) -> gr.Error:
    """Any failure as a short, escaped message that names the problem: no traceback, no server paths. The
    server's log gets one line for a user's mistake (ValueError, FileNotFoundError, our own gr.Error) and the
    traceback only for a real failure."""
    if isinstance(err, gr.Error):
        if err.print_exception:
            log.info("user error: %s", err.message)
            err.print_exception = False
        return err
    user = isinstance(err, (ValueError, FileNotFoundError))
    text = str(err) if user else f"{type(err).__name__}: {err}"
    for root in model_roots():
        for form in {str(root), str(root.resolve())}:
            text = text.replace(form, "weights")
    if len(text) > 300:
        text = text[:300] + " …"
    if user:
        log.info("user error: %s", text)
    else:
        log.error("failed: %s", text, exc_info=err)
    # duration None: the message stays until closed, not 10 s (the pictures it is about stay shown too)
    return gr.Error(html.escape(text, quote=False), duration=None, print_exception=False)


def not_started(message: str) -> str:
    """The status line for a request refused before any work: why, and that the pictures shown are older. A backslash
    in the message is shown as itself (a prompt's "\\(" would otherwise be Markdown's escape)."""
    shown = message.replace("\\", "\\\\")
    return f"**not started**: {shown} (the results shown are from the run before, if any)"


def not_done(message: str) -> str:
    """The status line for a job that stopped on an error (its message already escaped by user_error): why, and that
    the pictures shown are older."""
    return f"**not done**: {message} (the results shown are from the run before, if any)"


def friendly(handler):
    """A handler whose every exception reaches the browser as `user_error`'s message."""

    @functools.wraps(handler)
    def wrapped(*args, **kwargs):
        try:
            return handler(*args, **kwargs)
        except Exception as err:  # noqa: BLE001
            raise user_error(err) from None

    return wrapped


def relay(stream, status, preview=None, show=None):
    """A job handler's updates, keyed by component, for each item of `stream`: its progress text on `status` (a status
    line) and, where given, `show(preview)` on `preview` (a live preview); every other output of the handler is left
    as it is. Returns the stream's result. Closing the handler closes the stream (stopping its work)."""
    try:
        while True:
            try:
                image, text = next(stream)
            except StopIteration as done:
                return done.value
            except gr.Error as err:  # refused or failed once the job had started: the status line says why too
                yield {status: not_done(err.message)}
                raise
            update = {} if text is None else {status: text}
            if preview is not None and image is not None:
                update[preview] = show(image)
            yield update or gr.skip()
    finally:
        stream.close()

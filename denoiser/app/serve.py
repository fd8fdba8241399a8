"""Serving the web app: its command-line arguments, the Gradio server, and stopping on Ctrl-C or SIGTERM.

Started by `denoiser.app.main` (`denoiser app`, `python app.py`), which prepares the process before this
module imports Gradio. One sampling job runs at a time (a job waiting for it says its place and wait: denoiser.app.jobs);
each browser session keeps its own generation in `gr.State`, so sessions never see each other's images.

Memory: the server keeps the generations of the last `--max-sessions` sessions (each for 30 minutes at
most) and, with malloc held to two arenas, hands the memory it frees back to the system after every
sampling job (~60 ms); glibc otherwise keeps it. 100 fresh sessions of 64 images x 100 steps of the
tiny test model (~27 MB kept per session): before, 0.86 -> 2.65 GB and still +7 MB a session after
the 32nd; now 0.86 -> 1.73 GB, flat from the 35th session on.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import threading
import time
from pathlib import Path

from starlette.requests import ClientDisconnect

from denoiser.app.engine import Engine
from denoiser.app.layout import LAUNCH, build_app
from denoiser.app.photo_time import PHOTO_SECONDS
from denoiser.app.streaming import STOPPING, log
from denoiser.app.work_budget import WORK_BUDGET
from denoiser.fast import malloc
from denoiser.fast.kernels import load_kernels
from denoiser.folders.model_dir import WEIGHTS_ENV, model_roots
from denoiser.request import PRECISIONS

__all__ = ["run", "Disconnects"]


def _disconnect(exc: BaseException | None) -> bool:
    """Whether an exception is, or wraps (a cause, a context, an anyio task group's group), a client that left."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, ClientDisconnect):
            return True
        if hasattr(exc, "exceptions"):  # an exception group (anyio, Python 3.11+)
            return any(_disconnect(e) for e in exc.exceptions)
        exc = exc.__cause__ or exc.__context__
    return False


class Disconnects(logging.Filter):
    """A browser that leaves during an upload (a closed tab, a lost connection; many under load) is not a failure of
    the server: uvicorn's traceback for its ClientDisconnect becomes one line."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and _disconnect(record.exc_info[1]):
            record.msg, record.args = "a client left during a request (ClientDisconnect): nothing to do", ()
            record.exc_info, record.exc_text, record.levelno, record.levelname = None, None, logging.INFO, "INFO"
        return True


def _parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="denoiser app", description="denoiser web app")
    p.add_argument("--host", default="127.0.0.1", help="interface to bind (default: localhost only)")
    p.add_argument("--port", type=int, default=7860)
    p.add_argument("--share", action="store_true", help="create a public Gradio share link")
    p.add_argument("--weights", default=None,
                   help=f"folder of model folders (default: ${WEIGHTS_ENV}, then a clone's weights/)")
    p.add_argument(
        "--max-sessions",
        type=int,
        default=LAUNCH["state_session_capacity"],
        help="sessions whose generation stays in memory, oldest dropped first (default: %(default)s)",
    )
    p.add_argument("--max-work", type=float, default=None, metavar="UNITS",
                   help=f"work units one sampling request may use (default: $DENOISER_WORK_BUDGET, else {WORK_BUDGET:,}): "
                        "a local single-user app can allow more images and steps")
    p.add_argument("--photo-seconds", type=float, default=None, metavar="S",
                   help=f"seconds a photo's denoise may take at this machine's measured speed (default: "
                        f"$DENOISER_PHOTO_SECONDS, else {PHOTO_SECONDS:g}); a larger photo is denoised as a scaled copy")
    p.add_argument("--precision", default=None, choices=PRECISIONS,
                   help="what every UNet call runs in (default: $DENOISER_PRECISION, else auto: this machine's, decided "
                        "once by measurement); each result's PNG settings name it")
    args = p.parse_args(argv)
    if args.precision is not None:
        os.environ["DENOISER_PRECISION"] = args.precision  # what denoiser.fast.precision reads, for every job
    for flag, value, env, unit in (("--max-work", args.max_work, "DENOISER_WORK_BUDGET", "work units"),
                                   ("--photo-seconds", args.photo_seconds, "DENOISER_PHOTO_SECONDS", "seconds")):
        if value is not None:
            if not value > 0:
                raise SystemExit(f"{flag} must be a positive number of {unit}, got {value:g}")
            os.environ[env] = str(value)  # what denoiser.app.work_budget / denoiser.app.photo_time read
    if args.weights is not None and not Path(args.weights).is_dir():
        raise SystemExit(f"weights folder {args.weights!r} does not exist")
    if args.weights is None and not any(r.is_dir() for r in model_roots()):
        raise SystemExit(f"no models to serve: set {WEIGHTS_ENV} to a folder of model folders or pass --weights FOLDER")
    if args.max_sessions < 1:
        raise SystemExit(f"--max-sessions must be at least 1, got {args.max_sessions}")
    return args


def _serve(args: argparse.Namespace) -> None:
    """Serve until Ctrl-C or SIGTERM."""
    # before any handler thread allocates: Gradio runs handlers on a pool of threads, and glibc would give
    # each its own arena, whose free memory no other thread reuses (denoiser/fast/malloc.py)
    malloc.configure(arena_max=2)
    load_kernels()  # the C++ kernels built at install (`denoiser build-kernels`); loading never compiles
    app = build_app(Engine(args.weights))  # None: $DENOISER_WEIGHTS, then a clone's weights/
    launch = {**LAUNCH, "state_session_capacity": args.max_sessions}
    app.queue(default_concurrency_limit=2).launch(server_name=args.host, server_port=args.port, share=args.share,
                                                  prevent_thread_lock=True, **launch)  # fmt: skip

    def close(signum, frame) -> None:
        """Ctrl-C, and SIGTERM (kill, systemd, docker stop) alike: running sampling jobs stop at their next
        step, then Gradio ends its streams and closes the server (waiting at most 5 s for open requests)."""
        STOPPING.set()
        app.close()

    signal.signal(signal.SIGINT, close)
    signal.signal(signal.SIGTERM, close)
    while app.is_running:
        time.sleep(0.1)


def run(argv: list[str] | None = None) -> None:
    """Parse the app's arguments and serve until Ctrl-C or SIGTERM; running sampling jobs end first."""
    handler = logging.StreamHandler()  # the app's own lines (one per user error); other libraries keep theirs
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s: %(message)s", "%H:%M:%S"))
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False  # each line once: a handler on the root logger (basicConfig) would print it again
    for name in ("uvicorn.error", "uvicorn", "gradio"):
        logging.getLogger(name).addFilter(Disconnects())
    try:
        _serve(_parse_args(argv))
    finally:
        STOPPING.set()
        for worker in [t for t in threading.enumerate() if t.name == "denoiser-generate"]:
            worker.join(timeout=30)  # it stops at its next step; Python must not exit while it is in C++

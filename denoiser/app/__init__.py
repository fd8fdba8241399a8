"""The denoiser web app: `denoiser app` or `python app.py [--host 127.0.0.1] [--port 7860] [--share]
[--max-sessions 32] [--weights FOLDER]`.

This module starts the process. The app's parts, each in its own file: `serve` (arguments, the server,
stopping), `layout` (the page: its tabs in order) on `page` (what the tabs share), `sample_tab` (Generate, its
results) with `form` (a model's form) and `views` (what a generation shows, shared), `photo_tab`, `attention_tab`
and `heads_tab` (those tabs, each its components, handlers and wiring),
`jobs` (the jobs of the one sampling slot: a waiting job's place and wait, Stop), `streaming` (jobs in a worker thread, progress, errors for
people), `engine` (models, sampling and restoring, without the web) with `attention_views` (the
attention, word maps, four stages and heads it shows).

Gradio's served files go to a folder of the app's own (under GRADIO_TEMP_DIR when set), made before
Gradio is imported (parts of Gradio read GRADIO_TEMP_DIR only then), swept every 5 minutes and removed
on exit, on Ctrl-C and on SIGTERM.
"""

from __future__ import annotations

import atexit
import importlib.util
import os
import shutil
import signal
import tempfile
from pathlib import Path

__all__ = ["main"]

# an offline tool: no usage reports, no waiting on them (set before denoiser.app.serve imports Gradio)
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")


def _own_temp_folder() -> str:
    """A fresh folder for Gradio's files (under GRADIO_TEMP_DIR when that is set), made GRADIO_TEMP_DIR and
    removed when Python exits."""
    parent = os.environ.get("GRADIO_TEMP_DIR")
    if parent:
        Path(parent).mkdir(parents=True, exist_ok=True)
    folder = tempfile.mkdtemp(prefix="denoiser-app-", dir=parent)
    os.environ["GRADIO_TEMP_DIR"] = folder
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    return folder


def main(argv: list[str] | None = None) -> None:
    """Serve the app until Ctrl-C or SIGTERM (argv: the app's arguments, default sys.argv[1:])."""
    # SIGTERM (kill, systemd, docker stop) ends the app as Ctrl-C does, so that Python unwinds and removes
    # the app's temp folder even while it starts
    if importlib.util.find_spec("gradio") is None:  # found, not imported: Gradio reads GRADIO_TEMP_DIR at import
        raise SystemExit("denoiser app: the web app needs Gradio, an optional extra: pip install "
                         "'attention-denoiser[app]' (in a clone, `make app` installs it)")
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    _own_temp_folder()
    from denoiser.app.serve import run  # imports Gradio: after the temp folder is set

    run(argv)

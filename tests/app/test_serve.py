"""The app as a server and a process (denoiser/app/serve.py, denoiser/app/__init__.py, the stopping in
denoiser/app/streaming.py): a cancel stops the work, uploads are bounded, its memory stays flat, SIGTERM removes its
temp folder, no analytics, the missing extra named, a client that leaves is one log line."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.app.browser import free_port
from tests.conftest import ROOT


def _cpu_seconds_over(window: float) -> float:
    """CPU time this process (the app's server runs in it) spends during `window` seconds of wall-clock."""
    start = time.process_time()
    time.sleep(window)
    return time.process_time() - start


def _sampling_threads() -> list[threading.Thread]:
    """The app's sampling worker threads alive now (denoiser.app.streaming names them)."""
    return [t for t in threading.enumerate() if t.name == "denoiser-generate"]


def _assert_sampling_runs(window: float) -> None:
    """The sampling thread is alive and the server uses CPU (a share of a core: on a machine busy with other tests
    it gets less than one; stopped, it uses next to none)."""
    used = _cpu_seconds_over(window)
    assert _sampling_threads(), "no sampling thread is running"
    assert used > 0.1 * window, f"the generation is not running: {used:.2f} CPU seconds in {window} s"


def test_cancel_stops_the_sampling_work(server):
    from gradio_client import Client

    client = Client(server, verbose=False)
    job = client.submit("tiny-classes", "ddpm", 1000, 0, 64, "(any)", api_name="/generate")  # ~a minute of work
    _assert_sampling_runs(2.0)
    job.cancel()
    idle = [_cpu_seconds_over(1.0) for _ in range(5)]
    assert min(idle[1:]) < 0.25, f"sampling went on after the cancel (CPU seconds per second: {idle})"
    assert not _sampling_threads()
    # the slot is free again: a small job runs at once
    tic = time.monotonic()
    out = client.predict("tiny-classes", "ddim", 2, 0, 1, "(any)", api_name="/generate")
    assert len(out[1]) == 1 and time.monotonic() - tic < 20


def test_uploads_are_bounded(server):
    import httpx

    # 25 MB at most: a phone's JPEG fits, the editor's PNG of its small copy too (layout.LAUNCH)
    big = httpx.post(server + "gradio_api/upload", files={"files": ("big.bin", b"0" * (26 * 1024 * 1024))}, timeout=30)
    assert big.status_code in (400, 413) and "size" in big.text.lower()
    small = httpx.post(server + "gradio_api/upload", files={"files": ("small.bin", b"0" * 1024)}, timeout=30)
    assert small.status_code == 200




def test_analytics_are_off():
    import denoiser.app  # noqa: F401 - importing the app turns Gradio's analytics off (run alone, nothing else has)

    assert os.environ["GRADIO_ANALYTICS_ENABLED"] == "False"


@contextlib.contextmanager
def _app_process(weights: Path, temp_parent: Path, *args: str):
    """`python app.py` in a process of its own, as `make app` starts it, with GRADIO_TEMP_DIR=temp_parent;
    yields the process and its URL once it answers, and kills it at the end if it is still running."""
    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "GRADIO_TEMP_DIR": str(temp_parent)}
    log = temp_parent.parent / f"app-{port}.log"
    with log.open("w") as out:
        cmd = [sys.executable, str(ROOT / "app.py"), "--port", str(port), "--weights", str(weights), *args]
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/"
    try:
        import httpx

        deadline = time.monotonic() + 120
        while True:
            try:
                httpx.get(url, timeout=2)
                break
            except httpx.HTTPError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(f"app.py did not start:\n{log.read_text()[-3000:]}") from None
                time.sleep(0.2)
        yield proc, url
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def _rss_mb(pid: int) -> float:
    """A process's resident memory (Linux /proc), in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"/proc/{pid}/status has no VmRSS")


@pytest.mark.skipif(not Path("/proc/self/status").is_file(), reason="reads the server's RSS from /proc (Linux)")
def test_server_memory_stays_flat_and_dropped_sessions_are_freed(weights, tmp_path):
    """Issue 11 item 4, on app.py's own process with --max-sessions 2: over fresh sessions that each keep ~27 MB
    (64 images x 100 steps: step inputs and attention records), RSS stays at what two of them hold, and
    once small sessions have pushed them out, their memory is back with the system.

    Measured on a 2-core CPU: held 12..30 MiB, left -3..5 MiB. Without the app's malloc settings (two
    arenas, free memory handed back after each job): held 53..84, left 47..82, as glibc kept what was freed
    (the app before them, with its caching CPU allocator: left 34). A generation that outlived its
    session would add ~27 MiB per session."""
    from gradio_client import Client

    cap, measured = 2, 5  # a session that outlived the cap would add ~27 MiB each: 3 of them, over the 60 MiB bar
    with _app_process(weights, tmp_path / "gradio", "--max-sessions", str(cap)) as (proc, url):

        def fresh_session(steps: int, images: int) -> float:
            """One generation in a new session (as from a new browser tab); the server's RSS after it, in MiB."""
            client = Client(url, verbose=False, download_files=False)
            client.predict("tiny-classes", "ddim", steps, 0, images, "(any)", api_name="/generate")
            client.close()
            return _rss_mb(proc.pid)

        start = _rss_mb(proc.pid)
        # every shape sampled once (64 images, one step: little kept), then small sessions push those out
        warm_up = [fresh_session(1, 64) for _ in range(cap)] + [fresh_session(1, 1) for _ in range(cap)]
        big = [fresh_session(100, 64) for _ in range(measured)]
        small = [fresh_session(1, 1) for _ in range(cap)]  # the big ones are dropped
    numbers = (f"start {start:.0f} MiB, warm-up {[round(r) for r in warm_up]}, {measured} big sessions "
               f"{[round(r) for r in big]}, then small ones {[round(r) for r in small]}")
    held = max(big[cap:]) - max(big[:cap])  # once the cap is full
    assert held < 60, f"RSS grew {held:.0f} MiB after the {cap} kept sessions were in memory ({numbers})"
    left = small[-1] - warm_up[-1]  # small sessions only, both times
    assert left < 25, f"the dropped sessions left {left:.0f} MiB behind in the server ({numbers})"


@pytest.mark.skipif(sys.platform == "win32", reason="SIGTERM is a POSIX signal")
def test_sigterm_closes_the_app_and_removes_its_temp_folder(weights, tmp_path):
    """Issue 11 item 8: Gradio's served files go to a folder of the app's own, and SIGTERM (as from kill,
    systemd or docker stop) closes the server and removes it. Before: exit -15 at once, every file left."""
    from gradio_client import Client

    temp_parent = tmp_path / "gradio"
    with _app_process(weights, temp_parent) as (proc, url):
        made = list(temp_parent.iterdir())
        assert len(made) == 1 and made[0].name.startswith("denoiser-app-"), f"not one folder of the app's own: {made}"
        own = made[0]
        client = Client(url, verbose=False, download_files=False)
        out = client.predict("tiny-classes", "ddim", 2, 0, 3, "(any)", api_name="/generate")
        client.close()
        assert len(out[1]) == 3 and len(list(own.rglob("*.png"))) >= 4  # the grid and the gallery, served from there
        tic = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
        took = time.monotonic() - tic
    assert proc.returncode == 0, f"app.py ended with {proc.returncode}, not through its SIGTERM handler"
    assert took < 10, f"app.py took {took:.1f} s to stop after SIGTERM"
    left = sorted(str(p.relative_to(temp_parent)) for p in temp_parent.rglob("*"))
    assert not left, f"left behind under GRADIO_TEMP_DIR: {left[:10]}"




def test_the_app_without_gradio_says_which_extra_to_install(monkeypatch):
    """Gradio is an optional extra (attention-denoiser[app]): without it `denoiser app` says so, before any work."""
    import importlib.util

    from denoiser.app import main

    found = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "gradio" else found(name, *a))
    with pytest.raises(SystemExit, match=r"needs Gradio.*pip install 'attention-denoiser\[app\]'"):
        main(["--port", "0"])


def test_a_client_that_leaves_is_one_line_not_a_traceback(capsys):
    """Issue 51 item 14: under load, uploads whose browser left logged uvicorn's ClientDisconnect traceback; a
    disconnect is not a failure: one line. Other errors keep theirs."""

    from starlette.requests import ClientDisconnect

    from denoiser.app.serve import Disconnects

    logger = logging.getLogger("test-disconnects")
    handler = logging.StreamHandler()
    logger.addHandler(handler)
    logger.addFilter(Disconnects())
    logger.propagate = False
    try:
        for exc in (ClientDisconnect(), RuntimeError("upload failed")):
            try:
                try:
                    raise exc
                except Exception as inner:
                    raise OSError("the request's stream") from inner  # as a server's wrapping chains it
            except Exception:  # noqa: BLE001
                logger.exception("Exception in ASGI application")
    finally:
        logger.removeHandler(handler)
    err = capsys.readouterr().err
    left, failed = err.split("Exception in ASGI application", 1)
    assert left.strip() == "a client left during a request (ClientDisconnect): nothing to do"  # no traceback
    assert "Traceback" in failed and "RuntimeError: upload failed" in failed and "ClientDisconnect" not in failed




def test_max_work_and_photo_seconds_let_a_local_app_do_more(tmp_path, monkeypatch):
    """Issue 51 item 13, issue 58: `denoiser app --max-work UNITS` sets the work budget a sampling request may use and
    `--photo-seconds S` how long a photo's denoise may take (a local single-user app can allow more: a large photo at
    full size rather than a scaled copy); a budget that is no budget is refused."""
    from denoiser.app.photo_time import PHOTO_SECONDS, photo_seconds
    from denoiser.app.serve import _parse_args
    from denoiser.app.work_budget import WORK_BUDGET, work_budget

    for name in ("DENOISER_WORK_BUDGET", "DENOISER_PHOTO_SECONDS"):
        monkeypatch.delenv(name, raising=False)  # restored after the test, whatever _parse_args sets
    (tmp_path / "w").mkdir()
    _parse_args(["--weights", str(tmp_path / "w")])
    assert work_budget() == WORK_BUDGET
    _parse_args(["--weights", str(tmp_path / "w"), "--max-work", "1e6"])
    assert work_budget() == 1e6
    with pytest.raises(SystemExit, match="--max-work must be a positive number"):
        _parse_args(["--weights", str(tmp_path / "w"), "--max-work", "0"])
    assert photo_seconds() == PHOTO_SECONDS
    _parse_args(["--weights", str(tmp_path / "w"), "--photo-seconds", "1800"])
    assert photo_seconds() == 1800
    with pytest.raises(SystemExit, match="--photo-seconds must be a positive number of seconds, got -1"):
        _parse_args(["--weights", str(tmp_path / "w"), "--photo-seconds", "-1"])
    monkeypatch.setenv("DENOISER_PHOTO_SECONDS", "ten")
    with pytest.raises(ValueError, match="DENOISER_PHOTO_SECONDS must be a number of seconds, got 'ten'"):
        photo_seconds()

"""Time to the first image in the app: press Generate with the page's defaults and time the first live preview and
the finished result, as a visitor sees them in Chromium at 1280x900.

    .venv/bin/python -m bench.app_first_image [--repeats 3] [--weights weights]

Starts `denoiser app` on a free local port with the shipped models, loads the page, waits until the default
model's own settings are in the form (its scheduler, steps, guidance), then for each repeat reloads the page,
presses Generate and polls the page every 20 ms: `first preview` is when the live preview shows a picture,
`result` when the gallery does. Prints the form's settings, each repeat and the medians, with the CPU.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from bench.common import cpu_name

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = "/usr/bin/chromium"
BROWSER_ARGS = ["--no-sandbox", "--headless", "--disable-gpu", "--disable-background-networking",
                "--disable-component-update", "--disable-sync", "--no-first-run"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(url: str, timeout: float = 120) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            urllib.request.urlopen(url, timeout=2)
            return
        except OSError:
            time.sleep(0.5)
    raise SystemExit(f"the app did not answer at {url} within {timeout:.0f} s")


def settings(page) -> dict[str, str]:
    """The Sample tab's form as the visitor sees it."""
    values = {}
    for name, selector in (("scheduler", "#scheduler input"), ("steps", "#steps input[type=number]"),
                           ("images", "#num-images input[type=number]"), ("class", "#class input")):
        loc = page.locator(selector)
        values[name] = loc.first.input_value() if loc.count() else "?"
    return values


def one_run(page, url: str) -> tuple[float, float]:
    """(seconds to the first preview, seconds to the result) of one Generate on a freshly loaded page."""
    page.goto(url)
    page.wait_for_function("() => { const c = document.querySelector('#class input'); "
                           "return c && c.value && c.value !== '(any)'; }", timeout=120_000)
    tic = time.perf_counter()
    page.locator("#generate").click()
    first = None
    while True:
        if first is None and page.locator("#preview img").count():
            first = time.perf_counter() - tic
        if page.locator("#gallery img").count():
            return first if first is not None else time.perf_counter() - tic, time.perf_counter() - tic
        if time.perf_counter() - tic > 600:
            raise SystemExit("no result within 10 minutes")
        page.wait_for_timeout(20)


def main() -> None:
    from playwright.sync_api import sync_playwright

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--weights", default=str(ROOT / "weights"))
    args = p.parse_args()
    port = free_port()
    env = dict(os.environ, HF_HUB_OFFLINE="1", DENOISER_WEIGHTS=args.weights)
    server = subprocess.Popen([sys.executable, "-m", "denoiser.cli.main", "app", "--port", str(port)], cwd=ROOT, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}/"
    try:
        wait_for(url)
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=BROWSER_ARGS)
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            one_run(page, url)  # warm-up: the model loads, oneDNN primes its kernels
            form = settings(page)
            runs = [one_run(page, url) for _ in range(args.repeats)]
            browser.close()
    finally:
        server.terminate()
        server.wait(timeout=30)
    print(f"CPU {cpu_name()}; the page's defaults: {form}")
    for i, (first, done) in enumerate(runs):
        print(f"run {i + 1}: first preview {first:.2f} s, result {done:.2f} s")
    print(f"median of {len(runs)} after a warm-up: first preview {statistics.median(r[0] for r in runs):.2f} s, "
          f"result {statistics.median(r[1] for r in runs):.2f} s")


if __name__ == "__main__":
    main()

"""The app under test: a server on tiny and shipped models (the fixtures `weights`, `demo`, `server`) and a headless
Chromium page on it (`browser_page`), shared by the browser tests of every tab (a pytest plugin: tests/conftest.py names it)."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import time
from pathlib import Path

import pytest
import torch
from diffusers import DDPMScheduler

from denoiser import UNet
from denoiser.folders.model_dir import WEIGHTS_DIR
from denoiser.sampling.pipeline import save_pipeline
from tests.conftest import TINY

__all__ = ["CHROMIUM", "BROWSER_ARGS", "RESULTS", "browser_page", "open_app", "settled", "screenshots", "free_port", "choose", "click_result",
           "no_errors", "wait_for_status", "weights", "demo", "server"]

CHROMIUM = "/usr/bin/chromium"
RESULTS = ".grid-wrap button.thumbnail-item"  # a gallery's results in its grid (its open preview repeats them in a strip)
BROWSER_ARGS = ["--no-sandbox", "--headless", "--disable-gpu", "--disable-background-networking",
                "--disable-component-update", "--disable-sync", "--no-first-run"]


def screenshots(tmp_path: Path) -> Path:
    """Where browser tests write screenshots: DENOISER_SCREENSHOTS (`make screenshots`: docs/) or the test's folder."""
    shots = Path(os.environ.get("DENOISER_SCREENSHOTS", tmp_path))
    shots.mkdir(parents=True, exist_ok=True)
    return shots


def open_app(page, server: str) -> None:
    """Go to the app and wait until it has settled (`settled`)."""
    page.goto(server)
    settled(page)


def settled(page) -> None:
    """Wait until a page just opened or reloaded has settled: the load event has set the form to the default model's
    best (a class picked), as a visitor sees it. On a busy server it comes late, and would overwrite a change made
    before it (a model picked before it came was set back, and a text model's prompt hidden again)."""
    page.wait_for_function("() => { const c = document.querySelector('#class input'); "
                           "return c && c.value && c.value !== '(any)'; }", timeout=60_000)


@contextlib.contextmanager
def browser_pages(server: str, count: int, height: int = 900, init_script: str = "", width: int = 1280):
    """`count` headless Chromium pages on the app, each its own session (visitors side by side), 1280 wide unless told
    (a phone's: 390; `init_script`: run in each page before its own scripts)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=BROWSER_ARGS)
        try:
            pages = [browser.new_page(viewport={"width": width, "height": height}) for _ in range(count)]
            for page in pages:
                if init_script:
                    page.add_init_script(init_script)
                open_app(page, server)
            yield pages
        finally:
            browser.close()


@contextlib.contextmanager
def browser_page(server: str, height: int = 900, init_script: str = "", width: int = 1280):
    """One page of `browser_pages`."""
    with browser_pages(server, 1, height, init_script, width) as (page,):
        yield page


def choose(page, elem_id: str, index: int) -> str:
    """Open a dropdown and click its option `index`; the option's text."""
    page.locator(f"#{elem_id} input").click()
    option = page.locator(f"#{elem_id}").get_by_role("option").nth(index)
    text = option.inner_text().replace("✓", "").strip()
    option.click()
    return text


def click_result(page, gallery: str, index: int) -> None:
    """Click result `index` in the grid of gallery #gallery, as a person does (its preview opens), then close the
    preview. Escape closes it once it has the focus; under load the key can come first, and the preview stayed open
    over the grid, through later results too (CI, the walk's seed 41: a result under it could not be clicked), so
    its ✕ closes it then."""
    page.locator(f"#{gallery} {RESULTS}").nth(index).click()
    preview = page.locator(f"#{gallery} .preview")
    preview.wait_for(timeout=10_000)
    page.keyboard.press("Escape")
    try:
        preview.wait_for(state="detached", timeout=2_000)
    except Exception:  # noqa: BLE001 - still open: its Close button
        preview.get_by_role("button", name="Close").click()
        preview.wait_for(state="detached", timeout=10_000)


def type_number(page, elem_id: str, value, timeout_s: float = 30) -> None:
    """Type `value` into #elem_id's number box and press Enter, as a person does, until the box holds it for a second:
    a form update the page was still waiting for when the test typed (a model's own settings, on a busy CI machine)
    overwrites a value typed before it lands, where a person would see it and type again."""
    box = page.locator(f"#{elem_id} input[type=number]")
    deadline, held_since = time.monotonic() + timeout_s, None
    while time.monotonic() < deadline:
        if box.input_value() != str(value):
            box.fill(str(value))
            box.press("Enter")
            held_since = time.monotonic()
        elif held_since is None:
            held_since = time.monotonic()
        elif time.monotonic() - held_since >= 1.0:
            return
        page.wait_for_timeout(100)
    raise AssertionError(f"#{elem_id} does not keep the typed {value}: it shows {box.input_value()!r}")


def no_errors(page) -> None:
    """No error toast and no red "Error" badge anywhere on the page. Gradio's screen-reader live region (a 1-pixel
    `.sr-only` status at the page's root) is not one: it announces each event's status for a second, and after
    Stop it can announce the cancelled run as "Error" (Gradio's client, not a handler: no toast, no badge, no
    server traceback; seen in CI under load). What a person sees is checked here: an element the page's CSS hides
    (layout.CSS draws no red pill over a status block, which Gradio may still put in the page after Stop) is not."""
    # one pass over the page (the live region's text lasts a second): each innermost element whose text is "Error",
    # with its owner (the nearest id, or the toast and its text), what surrounds it, and its tags and classes
    found = page.evaluate("""() => [...document.querySelectorAll('body *')]
        .filter(e => e.textContent.trim() === 'Error' && ![...e.children].some(c => c.textContent.trim() === 'Error'))
        .filter(e => !e.closest('.sr-only') && e.checkVisibility())
        .map(e => {
            const toast = e.closest('[class*=toast-item], [class*=toast-body]');
            const path = [];
            for (let n = e; n && path.length < 8; n = n.parentElement)
                path.push(n.tagName.toLowerCase() + (n.className ? '.' + String(n.className).trim().split(/\\s+/).join('.') : ''));
            return {owner: e.closest('[id]') ? e.closest('[id]').id : (toast ? 'toast: ' + toast.innerText : '?'),
                    shown: e.closest('.block, .toast-body, div').parentElement.innerText.slice(0, 200),
                    path: path.join(' < ')};
        })""")
    owners, shown, paths = ([f[k] for f in found] for k in ("owner", "shown", "path"))
    assert not shown, f"an error is shown on {owners}: {shown}; at {paths}"
    assert page.get_by_text("didn't return enough output values").count() == 0


def wait_for_status(page, text, timeout_ms: int) -> None:
    """Wait until #status shows `text` (a string or a compiled pattern); past `timeout_ms`, fail with what the line
    reads, not with a bare timeout."""
    try:
        page.locator("#status").get_by_text(text).wait_for(timeout=timeout_ms)
    except Exception:  # playwright's TimeoutError
        pytest.fail(f"#status never showed {text!r} in {timeout_ms / 1000:g} s: it reads "
                    f"{page.locator('#status').inner_text()!r}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def weights(tmp_path_factory):
    """The shipped synthetic model when present (nicer screenshots), plus a tiny class-conditional one."""
    root = tmp_path_factory.mktemp("weights")
    torch.manual_seed(0)
    save_pipeline(UNet(**TINY, num_class_embeds=3).eval(), DDPMScheduler(), root / "tiny-classes")
    # two broken model folders: weights only as a pickle (.bin), and an unreadable config
    shutil.copytree(root / "tiny-classes", root / "bin-only")
    (root / "bin-only" / "unet" / "diffusion_pytorch_model.safetensors").rename(
        root / "bin-only" / "unet" / "diffusion_pytorch_model.bin")
    shutil.copytree(root / "tiny-classes", root / "broken-config")
    (root / "broken-config" / "unet" / "config.json").write_text("{not json")
    shipped = WEIGHTS_DIR / "synthetic-shapes"
    if (shipped / "unet" / "config.json").is_file():
        shutil.copytree(shipped, root / "synthetic-shapes")
        # its measured best guidance, as a shipped model's folder says it (the sliders start there)
        (root / "synthetic-shapes" / "sampling.json").write_text('{"pag_scale": 0.5, "guidance_scale": 2.0}')
    return root


@pytest.fixture(scope="module")
def demo(weights):
    from denoiser.app import layout  # Gradio imported by the app's tests only (this module is a plugin of every test's)
    from denoiser.app.engine import Engine

    return layout.build_app(Engine(weights))


@pytest.fixture(scope="module")
def server(demo):
    from denoiser.app import layout

    port = free_port()
    demo.queue().launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True, **layout.LAUNCH)
    yield f"http://127.0.0.1:{port}/"
    demo.close()

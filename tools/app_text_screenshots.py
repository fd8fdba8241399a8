"""The docs' pictures of the app with the shipped text model (weights/emoji): docs/app-text-prompt.png (a typed
prompt, its results) and docs/app-word-map.png (the Attention tab: one word's map, all layers together and in each
cross-attention layer, and a clicked pixel's weights over the words).

    python -m tools.app_text_screenshots [--prompt "red apple"] [--word apple] [--out docs]

Starts the app on weights/ at a free port on 127.0.0.1, drives it with Debian's chromium (as the browser tests do)
and stops it. About a minute on 2 cores.
"""

from __future__ import annotations

import argparse
import socket
from pathlib import Path

from denoiser.app.engine import Engine
from denoiser.app.layout import LAUNCH, build_app
from denoiser.folders.model_dir import WEIGHTS_DIR

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = "/usr/bin/chromium"  # Debian's, as the browser tests use it
BROWSER_ARGS = ["--no-sandbox", "--headless", "--disable-gpu", "--disable-background-networking",
                "--disable-component-update", "--disable-sync", "--no-first-run"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def no_errors(page) -> None:
    """Stop before a screenshot that would show an error: a visible "Error" badge or toast on the page."""
    shown = [e for e in page.get_by_text("Error", exact=True).all() if e.is_visible()]
    if shown:
        raise SystemExit(f"the page shows {len(shown)} error(s); no screenshot written")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="emoji", help="a text model folder under weights/")
    ap.add_argument("--prompt", default="red apple")
    ap.add_argument("--word", default="apple", help="the prompt's word whose map is shown")
    ap.add_argument("--pixel", default="0.5,0.45", help="the pixel clicked, as fractions x,y of the image")
    ap.add_argument("--out", type=Path, default=ROOT / "docs")
    args = ap.parse_args()
    fx, fy = (float(v) for v in args.pixel.split(","))

    from playwright.sync_api import sync_playwright

    demo = build_app(Engine(WEIGHTS_DIR))
    port = free_port()
    demo.queue().launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True, **LAUNCH)
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=BROWSER_ARGS)
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.goto(f"http://127.0.0.1:{port}/")
            page.locator("#model input").click()
            page.locator("#model").get_by_role("option", name=args.model, exact=True).click()
            page.locator("#class").wait_for(state="hidden", timeout=60_000)
            page.locator("#prompt textarea").fill(args.prompt)
            page.locator("#generate").click()
            page.locator("#status").get_by_text("done:").wait_for(timeout=300_000)
            page.wait_for_timeout(500)
            args.out.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(args.out / "app-text-prompt.png"), full_page=True)
            page.get_by_role("tab", name="Attention").click()
            page.locator("#words").get_by_text(args.word, exact=True).click()
            page.locator("#word-maps img").wait_for(timeout=60_000)
            image = page.locator("#clickable img")
            box = image.bounding_box()
            image.click(position={"x": box["width"] * fx, "y": box["height"] * fy})
            page.locator("#word-weights img").wait_for(timeout=60_000)
            page.locator("#maps img").wait_for(timeout=60_000)
            page.wait_for_timeout(1000)
            no_errors(page)
            page.screenshot(path=str(args.out / "app-word-map.png"), full_page=True)
            browser.close()
    finally:
        demo.close()
    print(f"wrote {args.out / 'app-text-prompt.png'} and {args.out / 'app-word-map.png'}")


if __name__ == "__main__":
    main()

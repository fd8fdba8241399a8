"""The page on a phone (denoiser/app/layout.py's CSS at 390 px), checked by what a person sees: every result on the
screen's width right under Generate, no label over a picture, charts at their own size with no icon over their
header, and no block over another (bounding boxes compared). Screenshots go where tests/app/browser.py (screenshots) says."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.app.browser import CHROMIUM, RESULTS, browser_page, no_errors, screenshots, type_number
from tests.app.test_text import weights  # noqa: F401 - the tiny text model "words" and a class model

pytestmark = pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="make test installs Debian's chromium")

PHONE = {"width": 390, "height": 844}
# every flex item of the Sample tab's row on a phone (its two columns dissolved: layout.CSS), shown ones only
ROW_ITEMS = """() => [...document.querySelectorAll('#sample-main > *, #sample-settings > *')]
    .filter(e => e.checkVisibility() && e.getBoundingClientRect().height > 0)
    .map(e => { const r = e.getBoundingClientRect();
                return {name: e.id || e.className.split(' ')[0], x: r.x, y: r.y + scrollY, w: r.width, h: r.height}; })"""


def _overlap(a: dict, b: dict, slack: float = 1.0) -> bool:
    """Whether two boxes ({x, y, width|w, height|h}) share more than a `slack`-pixel strip."""
    aw, ah = a.get("width", a.get("w")), a.get("height", a.get("h"))
    bw, bh = b.get("width", b.get("w")), b.get("height", b.get("h"))
    return (min(a["x"] + aw, b["x"] + bw) - max(a["x"], b["x"]) > slack
            and min(a["y"] + ah, b["y"] + bh) - max(a["y"], b["y"]) > slack)


def _generate_on_a_phone(page, prompt: str = "red apple") -> None:
    page.locator("#model input").click()
    page.locator("#model").get_by_role("option", name="words").click()
    page.locator("#prompt textarea").wait_for(state="visible", timeout=30_000)
    page.locator("#prompt textarea").fill(prompt)
    type_number(page, "steps", 2)
    type_number(page, "num-images", 8)
    page.locator("#generate").click()
    page.locator("#status").get_by_text("done:").wait_for(timeout=120_000)


def test_browser_on_a_phone_every_result_shows_right_under_generate(server, tmp_path):
    """Issue 72 finding 2: at 390 px, 8 results sat in 4 columns of a 326 px box (images 4 and 8 off-screen), the
    gallery's two-line label covered the top row, and the results came ~1,800 px below Generate, under the whole
    form. Now: the 8 results fit the width, none under the label, above the form, and no block over another."""
    with browser_page(server, **PHONE) as page:
        _generate_on_a_phone(page)
        page.locator(f"#gallery {RESULTS}").nth(7).wait_for(timeout=30_000)
        page.locator("#gallery").scroll_into_view_if_needed()  # its pictures load once in view (loading="lazy")
        page.wait_for_function("() => { const imgs = [...document.querySelectorAll('#gallery .grid-wrap img')]; "
                               "return imgs.length === 8 && imgs.every(i => i.complete && i.naturalWidth > 0); }",
                               timeout=30_000)
        page.screenshot(path=str(screenshots(tmp_path) / "app-phone-results.png"), full_page=True)
        gallery = page.locator("#gallery").bounding_box()
        results = [page.locator(f"#gallery {RESULTS}").nth(k).bounding_box() for k in range(8)]
        for k, box in enumerate(results):  # each whole on the screen's width, inside the gallery's box
            assert box["x"] >= 0 and box["x"] + box["width"] <= PHONE["width"], (k, box)
            assert box["x"] >= gallery["x"] - 1 and box["x"] + box["width"] <= gallery["x"] + gallery["width"] + 1, (k, box)
            assert box["width"] >= 64, (k, box)  # a picture, not a speck
        label = page.locator("#gallery [data-testid=block-label]").bounding_box()
        covered = [k for k, box in enumerate(results) if _overlap(label, box)]
        assert not covered, f"the gallery's label covers results {covered}: {label}"
        generate, model = page.locator("#generate").bounding_box(), page.locator("#model").bounding_box()
        assert generate["y"] < gallery["y"] < model["y"], (generate, gallery, model)  # the results before the form
        assert gallery["y"] - generate["y"] < 2 * PHONE["height"], (generate, gallery)
        items = page.evaluate(ROW_ITEMS)
        clashes = [(a["name"], b["name"]) for i, a in enumerate(items) for b in items[i + 1:] if _overlap(a, b)]
        assert not clashes, f"blocks over each other: {clashes}"
        no_errors(page)


def test_browser_on_a_phone_charts_keep_their_size_and_no_icon_covers_a_header(server, tmp_path):
    """Issue 72 finding 2: the word-map and pixel-map charts shrunk to the phone's width drew their labels ~4 px tall,
    and the fullscreen/download icons covered their headers. On a phone a chart keeps its own size (the box scrolls
    sideways) and its icons sit in the blank band above its first row of names."""
    with browser_page(server, **PHONE) as page:
        _generate_on_a_phone(page)
        page.get_by_role("tab", name="Attention").click()
        page.locator("#words").get_by_text("apple").click()
        page.locator("#clickable img").click(position={"x": 20, "y": 20})
        for chart in ("#word-maps", "#word-weights"):
            image = page.locator(f"{chart} img")
            image.wait_for(timeout=60_000)
            natural = image.evaluate("img => img.decode().then(() => img.naturalWidth)")
            shown = image.bounding_box()
            assert shown["width"] >= 0.99 * natural, f"{chart} is shrunk to {shown['width']:.0f} of {natural} px"
            band = {**shown, "height": 30 * shown["width"] / natural}  # words.py's _TOP: blank above the first row
            body = {**shown, "y": shown["y"] + band["height"], "height": shown["height"] - band["height"]}
            block = page.locator(chart).bounding_box()
            assert shown["x"] >= block["x"] - 1, f"{chart} starts left of its box (cut off): {shown}, {block}"
            for button in page.locator(f"{chart} .icon-button").all():
                if button.is_visible() and (box := button.bounding_box()) and box["width"] > 0:
                    assert not _overlap(box, body), f"an icon of {chart} covers its chart: {box}, {body}"
        page.screenshot(path=str(screenshots(tmp_path) / "app-phone-word-charts.png"), full_page=True)
        no_errors(page)


# each word of each "try these" header: the lines its text takes (a word broken inside, "guidan/ce", takes two)
HEADER_WORDS = """() => [...document.querySelectorAll('#try-these th')].filter(th => th.checkVisibility()).flatMap(th => {
    const text = th.querySelector('*') ? [...th.querySelectorAll('*')].map(e => e.firstChild)
        .find(n => n && n.nodeType === 3 && n.textContent.trim()) : th.firstChild;
    if (!text) return [];
    const words = [], re = /\\S+/g; let m;
    while ((m = re.exec(text.textContent))) {
        const range = document.createRange(); range.setStart(text, m.index); range.setEnd(text, m.index + m[0].length);
        const tops = new Set([...range.getClientRects()].map(r => Math.round(r.top)));
        words.push({word: m[0], lines: tops.size});
    }
    return words; })"""


@pytest.mark.parametrize("viewport", [PHONE, {"width": 1280, "height": 900}], ids=["phone", "desktop"])
def test_browser_drop_zones_show_their_words_and_headers_break_between_words(server, tmp_path, viewport):
    """Issue 72 finding 8: "Click to Upload" was cut off at the bottom of the settings box's drop zone, and on a phone the
    "try these" headers broke inside words ("guidan/ce", "promp/t")."""
    with browser_page(server, **viewport) as page:
        zone = page.locator("#settings-png")
        zone.scroll_into_view_if_needed()
        outer, words = zone.bounding_box(), zone.locator("[data-testid=upload-text]").bounding_box()
        label = zone.locator("[data-testid=block-label]").bounding_box()
        assert words["y"] >= outer["y"] and words["y"] + words["height"] <= outer["y"] + outer["height"], (words, outer)
        assert not _overlap(label, words), (label, words)
        assert zone.get_by_text("Click to Upload").is_visible()
        assert outer["height"] < 200, outer  # as tall as its words, not Gradio's 240 px of blank
        headers = page.evaluate(HEADER_WORDS)
        assert {h["word"] for h in headers} >= {"model", "guidance"}, headers
        broken = [h["word"] for h in headers if h["lines"] > 1]
        assert not broken, f"headers broken inside a word: {broken}"
        page.locator("#try-these").screenshot(path=str(screenshots(tmp_path) / f"app-try-these-{viewport['width']}.png"))

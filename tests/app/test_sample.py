"""The Sample tab in a browser (issue 41): what the page shows is what ran. A "try these" row shows the class it
generates with, and keeps the class selector; a refused request says why on the status line with no red "Error"
pill over it; Stop leaves no "Error" flash; a clicked row brings the status line and the live preview into view."""

from __future__ import annotations

import re
import time
import zipfile
from pathlib import Path

import httpx
import pytest

from denoiser.app.jobs import TICK_S
from denoiser.app.png_settings import read_settings
from tests.app.browser import (
    CHROMIUM,
    browser_page,
    browser_pages,
    no_errors,
    screenshots,
    type_number,
    wait_for_status,
)
from tests.app.walk_actions import OUT_OF_RANGE  # (elem_id, text, the control in the message, the field)

pytestmark = pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="make test installs Debian's chromium")

CLASS_COLUMN = 5  # the rows' columns: model, scheduler, steps, seed, images, class, guidance, PAG, autoguidance


def _rows(page):
    rows = page.get_by_text("try these").locator("xpath=ancestor::div[contains(@class,'block')][1]").locator("tbody tr")
    rows.first.wait_for(timeout=30_000)
    return rows


def _first_result_settings(page, tmp_path: Path) -> dict:
    """The settings the first result's PNG carries, as the browser downloads it."""
    src = page.locator("#gallery img").first.get_attribute("src")
    path = tmp_path / "first.png"
    path.write_bytes(httpx.get(src, timeout=30).content)
    return read_settings(path)


def _status_error_shown(page) -> bool:
    """A red "Error" pill drawn over the status line (Gradio's, when a handler raised)."""
    return any(e.is_visible() for e in page.locator("#status").get_by_text("Error", exact=True).all())


WATCH_STATUS = """() => { window.statusSeen = []; const s = document.querySelector('#status');
    new MutationObserver(() => window.statusSeen.push(s.innerText)).observe(s, {subtree: true, childList: true,
                                                                             characterData: true}); }"""
# the run it started has ended: its progress was shown, and "done" came after it (the same row twice gives the same
# images at the same address, so the gallery alone cannot tell)
RAN = """() => { const seen = window.statusSeen || [];
    const ran = seen.findIndex(t => t.includes('denoising'));
    return ran >= 0 && seen.slice(ran).some(t => t.startsWith('done:'))
        && document.querySelector('#status').innerText.startsWith('done:'); }"""


def _run_row(page, row) -> str:
    """Click a "try these" row and wait for its run; the class its row names."""
    wanted = row.locator("td").nth(CLASS_COLUMN).inner_text().strip()
    page.evaluate(WATCH_STATUS)
    row.click()
    page.wait_for_function(RAN, timeout=120_000)
    return wanted


def test_the_try_these_table_says_guidance_for_a_class_or_a_prompt(demo):
    """Issue 60 item 9: the column header said "guidance (with a class)" over the text model's rows too."""
    import gradio as gr

    table = next(b for b in demo.blocks.values() if isinstance(b, gr.Dataset) and b.elem_id == "try-these")
    assert "guidance" in table.headers and not [h for h in table.headers if "with a class" in h]
    assert table.headers[0] == "model"


def test_browser_a_try_these_row_shows_the_class_it_generates_with(server, tmp_path):
    """Issue 41 item 1: on a fresh page the other model's row generated its own class but showed the first class
    of that model (and the next Generate made that one); a row clicked twice hid the class selector."""
    with browser_page(server, height=1000) as page:
        rows = _rows(page)
        assert rows.count() == 2
        for index in (1, 1, 0):  # the other model's row on a fresh page, the same row again, the first model's row
            wanted = _run_row(page, rows.nth(index))
            page.wait_for_timeout(300)  # any late update of the class selector has landed
            assert page.locator("#class").is_visible(), f"row {index}: the class selector is hidden"
            assert page.locator("#class input").input_value() == wanted, f"row {index}: shows another class"
            assert _first_result_settings(page, tmp_path)["class"] == wanted
        # Generate now makes what the form shows
        type_number(page, "steps", 2)
        before = page.locator("#gallery img").first.get_attribute("src")
        page.locator("#generate").click()
        page.wait_for_function("b => document.querySelector('#gallery img').src !== b", arg=before, timeout=60_000)
        assert _first_result_settings(page, tmp_path)["class"] == page.locator("#class input").input_value()


def test_browser_a_row_runs_as_it_reads_whatever_the_advanced_settings_held(server, tmp_path):
    """The long walk, seed 9: a guidance interval typed before ("zzz") refused the "try these" row's run, and an eta
    typed before would have changed its images. A row sets the advanced settings back to the model's own, so it runs,
    and its PNG carries none of them."""
    with browser_page(server, height=1000) as page:
        page.locator("#advanced").get_by_text("advanced").first.click()
        page.locator("#interval textarea").fill("zzz")
        type_number(page, "eta", 1)
        _run_row(page, _rows(page).nth(0))
        assert page.locator("#interval textarea").input_value() == ""
        assert page.locator("#eta input[type=number]").input_value() == "0"
        made = _first_result_settings(page, tmp_path)
        assert "eta" not in made and "guidance_interval" not in made, made


def test_browser_a_clicked_row_keeps_the_status_and_preview_in_view(server):
    """Issue 41 item 13: the rows sit below the form; a click scrolled to the table, so the status line and the
    live preview of the run it started were off-screen."""
    with browser_page(server, height=700) as page:
        row = _rows(page).nth(0)
        row.scroll_into_view_if_needed()
        row.click()
        page.locator("#status").get_by_text("done:").wait_for(timeout=120_000)
        for selector in ("#status", "#preview"):
            box = page.locator(selector).bounding_box()
            assert box["y"] >= 0 and box["y"] < 700, f"{selector} is off-screen at y={box['y']:.0f}"


def test_browser_a_refused_request_says_why_without_an_error_pill(server, tmp_path):
    """Issue 41 item 3: over the work budget the toast stayed and the results were kept, but the status line got a
    red "Error" pill over stale text; "Error" also flashed on it after each Stop."""
    shots = screenshots(tmp_path)
    with browser_page(server) as page:
        type_number(page, "steps", 2)
        page.locator("#generate").click()
        page.locator("#status").get_by_text("done:").wait_for(timeout=60_000)
        shown = page.locator("#gallery img").first.get_attribute("src")
        type_number(page, "num-images", 64)
        type_number(page, "steps", 1000)
        page.locator("#budget").get_by_text("over the work budget").wait_for(timeout=30_000)
        page.locator("#generate").click()
        page.locator("#status").get_by_text("not started").wait_for(timeout=30_000)
        assert "over the budget" in page.locator("#status").inner_text()
        page.wait_for_timeout(500)
        page.screenshot(path=str(shots / "app-refused.png"))
        assert not _status_error_shown(page)
        assert page.locator("#gallery img").first.get_attribute("src") == shown  # the results shown stay
        # Stop: watched every 50 ms from the click until the status line says where it stopped
        type_number(page, "steps", 400)
        type_number(page, "num-images", 8)
        page.locator("#budget").get_by_text("work:").wait_for(timeout=30_000)
        page.locator("#generate").click()
        page.locator("#status").get_by_text("denoising: step").wait_for(timeout=30_000)
        page.locator("#stop").click()
        flashed, deadline = [], time.monotonic() + 10
        while time.monotonic() < deadline and "stopped at step" not in page.locator("#status").inner_text():
            flashed.append(_status_error_shown(page))
            page.wait_for_timeout(50)
        assert "stopped at step" in page.locator("#status").inner_text()
        assert not any(flashed), f"an Error pill showed on the status line in {sum(flashed)} of {len(flashed)} looks"


# the page's request for the work of 64 images x 50 steps reaches the server 2 s late, as a request can under load
LATE_REQUEST = """
const post = window.fetch;
window.fetch = async (url, options) => {
    const body = options && typeof options.body === "string" ? options.body : "";
    if (String(url).includes("queue/join") && body.includes('"data":[') ) {
        const data = JSON.parse(body).data;
        if (data[1] === 50 && data[2] === 64) await new Promise(r => setTimeout(r, 2000));
    }
    return post(url, options);
};
"""


def test_browser_the_budget_note_is_of_the_latest_form_when_an_older_request_comes_late(server):
    """The CI run of 2026-12-05: 64 typed into images, then 1000 into steps, and the note stayed at 64 x 50 ("work:
    2,408 of 30,000 units"): the page posts a request per change, and the older one reached the server last."""
    with browser_page(server, init_script=LATE_REQUEST) as page:
        page.wait_for_function("() => document.querySelector('#steps input[type=number]').value === '50'")
        type_number(page, "num-images", 64)
        page.wait_for_timeout(300)  # the late request (64 x 50) has gone out, and waits
        type_number(page, "steps", 1000)
        page.wait_for_timeout(4000)  # both have landed
        assert "over the work budget" in page.locator("#budget").inner_text()


def test_browser_on_a_phone_the_class_sits_under_generate_and_the_rows_fit(server, tmp_path):
    """Issue 41 item 14: at 390x844 the model and class sat ~2,000 px down, below the results; Generate, its status
    and the live preview stay on the first screen (issue 35 item 11). Issue 51 item 12: the class (a text model's
    prompt, tests/app/test_text.py) right under Generate's status, and the "try these" table within the width."""
    with browser_page(server, height=844, width=390) as page:
        type_number(page, "steps", 2)
        page.locator("#generate").click()
        page.locator("#status").get_by_text("done:").wait_for(timeout=60_000)
        top = {sel: page.locator(sel).bounding_box()["y"] for sel in ("#generate", "#status", "#preview", "#class",
                                                                      "#gallery")}
        page.screenshot(path=str(screenshots(tmp_path) / "app-phone-order.png"), full_page=True)
        assert top["#generate"] < top["#status"] < top["#class"] < top["#preview"] < top["#gallery"], top
        assert top["#class"] - top["#status"] < 150 and top["#preview"] < 844, top  # the preview on the first screen
        table = page.locator("#try-these table").bounding_box()
        assert table["x"] >= 0 and table["x"] + table["width"] <= 390 - 16, table  # its right edge shown


def test_browser_an_out_of_range_number_is_refused_in_words_and_nothing_runs(server, capfd):
    """Issue 51 item 2: Gradio's own bounds refused -5 steps or seed 1e20 before our handler ran: a traceback in the
    log per try, a status line that kept the previous run's text, and steps -5 or images -3 ran at 1 after the
    toast. Now the handler checks (denoiser.app.form_limits): the status says "not started: …" naming the value's
    control, and nothing runs."""
    with browser_page(server) as page:
        type_number(page, "steps", 2)
        page.locator("#generate").click()
        page.locator("#status").get_by_text("done:").wait_for(timeout=60_000)
        shown = page.locator("#gallery img").first.get_attribute("src")
        capfd.readouterr()
        for elem_id, value, name, _ in OUT_OF_RANGE:
            box = page.locator(f"#{elem_id} input[type=number]")
            box.fill(value)
            box.press("Enter")
            page.wait_for_timeout(300)  # the change has landed (a slider's budget note is its only other event)
            page.evaluate(WATCH_STATUS)
            before = page.locator("#status").inner_text()  # each value's refusal quotes it: a new line is this one's
            page.locator("#generate").click()
            page.wait_for_function("before => { const s = document.querySelector('#status').innerText; "
                                   "return s.startsWith('not started') && s !== before; }", arg=before, timeout=30_000)
            status = page.locator("#status").inner_text()
            assert f"{name} must be a whole number" in status, (value, status)
            page.wait_for_timeout(1000)  # a run the refusal did not stop would have started by now
            seen = page.evaluate("() => window.statusSeen")
            assert not any("denoising" in t for t in seen), (value, seen)
            assert page.locator("#gallery img").first.get_attribute("src") == shown  # the results shown stay
            assert page.get_by_text("less than minimum").count() == page.get_by_text("greater than maximum").count() == 0
            box.fill("2" if elem_id != "seed" else "0")
            box.press("Enter")
        log = capfd.readouterr().err
        assert "Traceback" not in log and "gradio.exceptions.Error" not in log, log[-2000:]




@pytest.fixture
def slow_steps(monkeypatch):
    """Each sampling step takes UNET_S longer, as a real model's UNet call on a busy CPU does (cifar10's on 2 cores);
    the runs the server started, in a list."""
    from denoiser.app.engine import Engine

    generate, runs = Engine.generate, []

    def slow(self, *args, on_step=None, **kwargs):
        runs.append(time.monotonic())

        def step(*a):
            time.sleep(UNET_S)
            return on_step(*a)

        return generate(self, *args, on_step=step if on_step else None, **kwargs)

    monkeypatch.setattr(Engine, "generate", slow)
    return runs


UNET_S = 0.4
# after Stop, the next Generate at these gaps (seconds): the old page dropped one pressed within ~0.5 s of Stop
STOP_GAPS = (0.05, 0.2, 0.1, 0.3, 0.0)


def test_browser_generate_right_after_stop_runs(server, slow_steps):
    """Issue 51 item 1: Generate, Stop after a few seconds, Generate again within 0.2 s: in 3 of 4 tries nothing ran (no
    queue message, the status line stuck at "stopped at step k / N"). Gradio's page skips a click on a button whose
    event is still open, and a stopped job's is open until it ends, a UNet step later. The job's trigger mode
    "always_last" (controls.JOB) holds such a click back and sends it once the stopped job has ended, which it does
    as an event that succeeded (it writes its own "stopped at step k"): each try's run starts. Then Stop, Generate
    at once and Stop again (CI, stop 62: the second Stop was lost and the held-back run went on unseen): the second
    Stop drops that Generate, which says so, and nothing runs on."""
    runs = slow_steps
    with browser_page(server) as page:
        type_number(page, "steps", 200)
        type_number(page, "num-images", 2)
        page.locator("#budget").get_by_text("work:").wait_for(timeout=30_000)
        page.locator("#generate").click()
        for k, gap in enumerate(STOP_GAPS):
            deadline = time.monotonic() + 30
            while len(runs) < k + 1 and time.monotonic() < deadline:  # this try's run has started on the server
                page.wait_for_timeout(100)
            if len(runs) < k + 1:
                seen = page.evaluate("() => window.statusSeen || []")
                pytest.fail(f"try {k} (Generate {STOP_GAPS[k - 1]} s after Stop): nothing ran; the status line showed "
                            f"{seen[-3:]}")
            page.locator("#status").get_by_text("denoising: step").wait_for(timeout=30_000)
            page.wait_for_timeout(1500)
            page.locator("#stop").click()
            page.wait_for_timeout(int(gap * 1000))
            page.evaluate(WATCH_STATUS)
            page.locator("#generate").click()
        deadline = time.monotonic() + 30  # the last try's run has started on the server (its status line may still
        while len(runs) < len(STOP_GAPS) + 1 and time.monotonic() < deadline:  # show the stopped run's last step)
            page.wait_for_timeout(100)
        assert len(runs) == len(STOP_GAPS) + 1, f"the last try (Generate {STOP_GAPS[-1]} s after Stop): nothing ran"
        page.locator("#status").get_by_text("denoising: step").wait_for(timeout=30_000)
        page.locator("#stop").click()
        page.wait_for_timeout(100)  # the stopped run is most likely still in its UNet step: this click is held back
        page.locator("#generate").click()
        page.locator("#stop").click()
        # held back, it is cancelled; sent already (the stopped run had ended), it stops before its first step
        wait_for_status(page, re.compile(r"cancelled before it started|stopped before its first step|stopped at step 1 /"),
                        30_000)
        started = len(runs)
        page.wait_for_timeout(3 * UNET_S * 1000)  # a run that went on would show its steps by now
        assert started <= len(STOP_GAPS) + 2 and len(runs) == started, "a Generate stopped before it ran started"
        assert "denoising" not in page.locator("#status").inner_text()
        no_errors(page)


# Gradio's status trackers a person can see, with text in them ("queue: 1/1 | 6.2/4.8s"): (owner id, text)
SHOWN_TRACKERS = """() => [...document.querySelectorAll('[data-testid=status-tracker]')]
    .filter(e => e.innerText.trim() && getComputedStyle(e).opacity !== '0' && e.checkVisibility())
    .map(e => [e.closest('[id]')?.id, e.innerText])"""
QUEUE_STEPS = 60  # the first visitor's run: 60 steps of ~UNET_S (slow_steps), ~25 s


def test_browser_a_waiting_job_says_its_place_and_its_wait(server, slow_steps, tmp_path):
    """Issue 72 item 1: page A runs a long Generate; a fresh page B presses Generate. B's status line had no height and
    Gradio's queue text was clipped on it, so B looked idle; the only wait shown was Gradio's own ("queue: 1/1 |
    6.2/4.8s" for a real ~80 s). B's line now says its place and a wait from the running job's measured speed,
    within 30 % of the real wait, on a line with its height and nothing over it, and says it again as it counts down."""
    runs = slow_steps
    with browser_pages(server, 2) as (first, second):
        for page in (first, second):
            type_number(page, "steps", QUEUE_STEPS)
            type_number(page, "num-images", 1)
        first.locator("#generate").click()
        first.locator("#status").get_by_text(re.compile(r"denoising: step [5-9] /")).wait_for(timeout=60_000)
        second.locator("#generate").click()
        clicked = time.monotonic()
        line = second.locator("#status").get_by_text("waiting in the queue")
        line.wait_for(timeout=30_000)
        text = second.locator("#status").inner_text()
        second.screenshot(path=str(screenshots(tmp_path) / "app-queued.png"))
        assert "1 job ahead" in text, text
        said = int(re.search(r"starts in about (\d+) s", text).group(1))
        box = second.locator("#status").bounding_box()
        assert box["height"] >= 16, f"the status line has no height: {box}"
        assert not second.evaluate(SHOWN_TRACKERS), "Gradio's own queue text is drawn"  # nor over the line
        counted = said  # the line is said again each TICK_S while it waits: the wait counts down
        deadline = time.monotonic() + 4 * TICK_S
        while counted >= said and len(runs) < 2 and time.monotonic() < deadline:
            second.wait_for_timeout(200)
            found = re.search(r"starts in about (\d+) s", second.locator("#status").inner_text())
            counted = int(found.group(1)) if found else counted
        assert counted < said, f"the wait said at the click ({said} s) did not count down"
        deadline = time.monotonic() + 120
        while len(runs) < 2 and time.monotonic() < deadline:
            second.wait_for_timeout(100)
        assert len(runs) == 2, "the second visitor's job never started"
        waited = runs[1] - clicked
        assert abs(said - waited) <= 0.3 * waited, f"said about {said} s; it waited {waited:.1f} s"
        print(f"queue estimate: said {said} s, waited {waited:.1f} s ({said / waited - 1:+.0%})")
        second.locator("#status").get_by_text("done:").wait_for(timeout=120_000)


def test_browser_a_new_run_closes_the_messages_of_earlier_requests(server):
    """Issue 51 item 4: error messages stay until closed, so they piled up, and "generate images first" stayed on the
    page after a generation existed. A new request closes the earlier ones; its own stay."""
    with browser_page(server) as page:
        page.get_by_role("tab", name="Attention", exact=True).click()
        page.get_by_role("button", name="show", exact=True).click()
        toasts = page.locator("[data-testid=toast-body]")
        toasts.filter(has_text="generate images first").first.wait_for(timeout=30_000)
        page.get_by_role("tab", name="Sample", exact=True).click()
        type_number(page, "steps", 2)
        page.locator("#generate").click()
        page.locator("#status").get_by_text("done:").wait_for(timeout=60_000)
        assert toasts.filter(has_text="generate images first").count() == 0, toasts.all_inner_texts()
        type_number(page, "steps", -5)
        page.locator("#generate").click()
        toasts.filter(has_text="steps must be a whole number").first.wait_for(timeout=30_000)  # its own message stays
        assert toasts.count() == 1, toasts.all_inner_texts()


def test_browser_a_png_dropped_on_the_sample_tab_fills_the_form(server, tmp_path):
    """Issue 60 item 2: a PNG this app wrote, dropped on the Sample tab, fills the form with what made it (A1111's PNG
    Info); a picture from elsewhere is said to be one."""
    from PIL import Image

    from denoiser.app.png_settings import save_with_settings

    made = {"model": "tiny-classes", "seed": 4242, "scheduler": "ddim", "steps": 7, "num_images": 2, "class": "1",
            "guidance_scale": 2.0, "pag_scale": 0.0, "guide_scale": 1.0, "index": 0, "count": 2}
    png = save_with_settings(Image.new("RGB", (16, 16), (200, 30, 30)), tmp_path, made)
    plain = tmp_path / "holiday.png"
    Image.new("RGB", (16, 16), (30, 200, 30)).save(plain)
    with browser_page(server) as page:
        page.locator("#settings-png input[type=file]").set_input_files(str(png))
        page.locator("#status").get_by_text(f"settings of {png.name} restored: press Generate").wait_for(timeout=30_000)
        page.wait_for_function("() => document.querySelector('#seed input[type=number]').value === '4242'", timeout=10_000)
        assert page.locator("#steps input[type=number]").input_value() == "7"
        page.screenshot(path=str(screenshots(tmp_path) / "app-sample-settings-png.png"), full_page=True)
        page.locator("#settings-png").get_by_role("button", name="Clear").first.click()
        page.locator("#settings-png input[type=file]").set_input_files(str(plain))
        page.locator("#status").get_by_text("holiday.png carries no settings of this app: it is a picture").wait_for(
            timeout=30_000)
        no_errors(page)


def test_browser_switch_off_is_stoppable_and_a_queued_generate_cancelled_says_so(server, slow_steps):
    """Issue 60 item 1: with "Switch off and regenerate" running, the Heads tab's Stop did nothing and its progress
    showed far below the button; a Generate pressed meanwhile waited ("queue: 1/1"), Sample's Stop dropped it, and the
    status line fell back to the old "done: ..." without a word. Now the switch has its own status line and Stop, and
    a job stopped while queued says it was cancelled before it started."""
    with browser_page(server, height=1000) as page:
        _choose_model(page, "tiny-classes")
        type_number(page, "steps", 30)
        type_number(page, "num-images", 1)
        page.locator("#budget").get_by_text("work:").wait_for(timeout=30_000)
        page.locator("#generate").click()
        page.locator("#status").get_by_text("done:").wait_for(timeout=60_000)
        page.get_by_role("tab", name="Heads").click()
        page.locator("#stats-run").click()
        page.locator("#stats-status").get_by_text("done:").wait_for(timeout=60_000)
        page.locator("#off-layers input").click()
        page.get_by_role("option", name="mid_attn").click()
        page.keyboard.press("Escape")
        page.locator("#off-run").click()
        page.locator("#off-status").get_by_text("switching off: step").wait_for(timeout=30_000)  # beside its button
        page.get_by_role("tab", name="Sample").click()
        page.locator("#generate").click()  # waits in the queue behind the switch
        page.wait_for_timeout(1500)
        page.locator("#stop").click()
        page.locator("#status").get_by_text("cancelled before it started").wait_for(timeout=30_000)
        page.get_by_role("tab", name="Heads").click()
        page.locator("#off-stop").click()
        try:
            page.locator("#off-status").get_by_text("stopped at step").wait_for(timeout=30_000)
        except Exception:
            pytest.fail(f"after Stop the switch's line reads {page.locator('#off-status').inner_text()!r}")
        no_errors(page)


def _choose_model(page, name: str) -> None:
    page.locator("#model input").click()
    page.get_by_role("option", name=name, exact=True).click()
    page.wait_for_function(f"() => document.querySelector('#model input').value === '{name}'", timeout=10_000)


def test_browser_before_the_first_step_the_status_is_this_jobs_not_an_old_estimate(server, slow_steps):
    """Issue 60 item 9: before a job's first step the status line showed Gradio's estimate, the average time to the
    first output of the button's earlier jobs ("processing | 0.3/1.6s" after a 3-step run, for a 20-step one). Now the
    job's own line shows at once: "denoising: starting", no estimate of another job's."""
    with browser_page(server) as page:
        _generate(page, steps=3, images=1)
        type_number(page, "steps", 20)
        page.locator("#generate").click()
        page.locator("#status").get_by_text("denoising: starting").wait_for(timeout=30_000)  # slow_steps: a 0.4 s step
        shown = page.locator("#status").inner_text()
        assert "processing" not in shown and not re.search(r"\d/\d+(\.\d+)?s", shown), shown
        page.locator("#status").get_by_text("done:").wait_for(timeout=60_000)


def test_browser_download_all_is_one_zip_named_after_the_run(server, tmp_path):
    """Issue 60 item 9: Gradio's "Download All" names every zip gallery.zip. Now the results' own button downloads
    them in one zip named after the run, each PNG inside under its own name."""
    with browser_page(server) as page:
        _generate(page, steps=2, images=3)
        button = page.locator("#download-all")
        button.wait_for(timeout=30_000)
        with page.expect_download() as event:
            button.click()
        download = event.value
        path = tmp_path / download.suggested_filename
        download.save_as(path)
    assert re.fullmatch(r"tiny-classes-seed0-[^/]+\.zip", path.name), path.name
    with zipfile.ZipFile(path) as zf:
        inside = sorted(zf.namelist())
    stem = path.name.removesuffix(".zip")
    assert inside == [f"{stem}-{i}of3.png" for i in (1, 2, 3)], inside


def _generate(page, steps: int, images: int) -> None:
    """The tiny class model's Generate of `images` images in `steps` steps, run to its end."""
    _choose_model(page, "tiny-classes")
    type_number(page, "steps", steps)
    type_number(page, "num-images", images)
    page.locator("#generate").click()
    page.locator("#status").get_by_text("done:").wait_for(timeout=60_000)

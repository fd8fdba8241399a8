"""A seeded random click-walk over the app's four tabs (tests/app/test_walk.py runs it): a person's clicks, drawn
by weight from what each tab offers, and after each one the page settles and the invariants every state must keep
are checked, as STYLE.md's "The app's page tells the truth" puts them:

- no server traceback (the captured stderr, error records of any logger);
- no error toast but the messages the app means to give (ALLOWED), and no red "Error" pill anywhere;
- the Sample form shows what the last result was made with (its PNG's settings), where the walk has not changed it since;
- each status line describes its gallery (a "done" line its images, a stopped or refused run the pictures from before);
- every control holds a valid value (numbers in range, the model's own classes, a class selector for a model with classes).

A failure names the seed and the numbered actions so far: DENOISER_WALK_SEED=N DENOISER_WALK_STEPS=M replays them.
Here: running the walk and reading the page; the actions are tests/app/walk_actions.py's, the checks
tests/app/walk_checks.py's.
"""

from __future__ import annotations

import io
import json
import os
import random
import re
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from PIL import Image

from denoiser.app.png_settings import SETTINGS_KEY
from tests.app.browser import RESULTS, settled
from tests.app.walk_actions import WalkActions
from tests.app.walk_checks import ALLOWED, WalkChecks

__all__ = ["ALLOWED", "Walk", "WalkFailure"]

# the longest a settled action may take: a Generate of the walk's sizes on a busy 2-core machine; the shipped models
# (`make walk WALK_MODELS=...`) run up to the work budget's minute per job, slower beside other work: WALK_SETTLE_S
SETTLE_S = float(os.environ.get("DENOISER_WALK_SETTLE_S", "120"))
QUIET_S = 1.0  # settled: no job queued or running and no progress shown for this long


class WalkFailure(AssertionError):
    pass


# every visible labelled block of the page: its id, its label, its value, as a person reads them
READ_BLOCKS = """() => [...document.querySelectorAll('[data-testid=block-info]')].filter(i => i.offsetParent).map(i => {
    const b = i.closest('.block'), radio = b.querySelector('input[type=radio]:checked');
    const box = b.querySelector('input[type=number], input[role=combobox], textarea, input[type=text]');
    const check = b.querySelector('input[type=checkbox]');
    return {id: b.id, label: i.innerText.trim(), value: radio ? radio.value : box ? box.value : check ? String(check.checked) : null};
})"""
# a job is shown as running: a status tracker's progress, eta or queue text
BUSY = """() => [...document.querySelectorAll('[data-testid=status-tracker]')].some(t => t.offsetParent &&
    t.querySelector('.progress-text, .meta-text, .meta-text-center, .eta-bar, .progress-level'))"""

# the page when an action failed (Walk.state): the status line, the Sample results, which blocks show a loading overlay
STATE = f"""() => ({{status: (document.querySelector('#status') || {{}}).innerText || '',
    thumbs: document.querySelectorAll('#gallery {RESULTS}').length,
    preview: !!document.querySelector('#gallery .preview'),
    pending: [...document.querySelectorAll('.block')].filter(b => b.offsetParent && b.querySelector(
        ':scope > [data-testid=status-tracker].pending, :scope > .wrap.pending')).map(b => b.id || b.className).join(', '),
    toasts: [...document.querySelectorAll('.toast-body')].map(t => t.innerText.slice(0, 80)).join(' | ')}})"""


def why_not(err: Exception) -> str:
    """Playwright's error in a line or a few: its first line and what its call log last waited on (an element not
    found, not visible, or covered by another)."""
    lines = [line.strip(" -") for line in str(err).splitlines() if line.strip(" -")]
    log = [line for line in lines[1:] if line != "Call log:" and not re.fullmatch(r"retrying .*|waiting \d+ms", line)]
    return lines[0][:300] + ("" if not log else " (" + "; ".join(dict.fromkeys(log[-4:]))[:400] + ")")


@dataclass
class Walk(WalkActions, WalkChecks):
    """One seeded walk over one page: actions drawn from `rng`, the invariants checked after each."""

    page: object  # a Playwright page on the app
    idle: Callable[[], bool]  # the server has no job queued or running
    server_log: Callable[[], str]  # what the server wrote since the last call (stderr, error log records)
    models: dict[str, list[str] | None]  # each model offered and its classes (None: it does not load)
    tmp: Path
    seed: int
    rng: random.Random = field(init=False)
    steps: list[str] = field(default_factory=list)  # what was done, numbered for the replay
    tab: str = "Sample"
    reference: dict | None = None  # the settings the Sample form shows where the walk has not changed it
    touched: set = field(default_factory=set)  # form fields the walk changed since `reference` was set
    typed: dict = field(default_factory=dict)  # free text the walk typed into a selector, by elem_id
    gallery: list = field(default_factory=list)  # the Sample results last seen (file URLs)
    photo_gallery: list = field(default_factory=list)
    before_run: list = field(default_factory=list)  # the Sample results before the last Generate
    before_photo: list = field(default_factory=list)  # the Photo results before the last Run
    photo_touched: set = field(default_factory=set)  # Photo controls changed since its last result
    earlier_pick: int = 0  # the earlier result last clicked
    settings_cache: dict = field(default_factory=dict)
    segment: int = 0  # the first step since the page was last (re)loaded
    runs: list = field(default_factory=list)  # the settings of each Sample run seen, for the earlier results
    expect_run: str = ""  # a Generate the last action pressed that must have run (or said why not), in words

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)

    # ---- running ----------------------------------------------------------------------------------------------

    def run(self, max_steps: int, max_seconds: float, keep_going: bool = False) -> int:
        """Up to max_steps actions within max_seconds, each checked; the number done. The first failure raises
        WalkFailure; with keep_going, each failure is kept, the page reloaded (a fresh session) and the walk goes
        on, and WalkFailure at the end names them all."""
        start, failures = time.monotonic(), []
        self.settle()
        self.check()
        while len(self.steps) < max_steps and time.monotonic() - start < max_seconds:
            try:
                self.step()
            except WalkFailure as failure:
                if not keep_going:
                    raise
                failures.append(str(failure))
                self.restart()
        if failures:
            raise WalkFailure(f"{len(failures)} failure(s):\n\n" + "\n\n".join(failures))
        return len(self.steps)

    def step(self) -> None:
        """One action drawn at random, the page settled, the invariants checked."""
        action, tab = self.choose(), self.tab
        try:
            self.steps.append(f"[{tab}] " + action())
        except Exception as err:  # noqa: BLE001 - a control the action needs is missing or stuck: reported with the steps
            self.steps.append(f"[{tab}] {action.__name__} (failed)")
            self.fail([f"the action could not be done: {why_not(err)}", self.state()])
        if not self.settle():
            self.fail([f"the page did not settle within {SETTLE_S} s (a job still queued or running)"])
        self.check()

    def restart(self) -> None:
        """After a failure (keep_going): the page reloaded, a fresh session whose state the walk knows again."""
        self.page.reload()
        settled(self.page)
        self.steps.append("(reload the page: a fresh session)")
        self.segment = len(self.steps)
        # (the runs seen stay: the browser keeps its earlier results over a reload)
        self.tab, self.reference, self.touched, self.typed = "Sample", None, set(), {}
        self.gallery, self.photo_gallery, self.before_run, self.before_photo, self.photo_touched = [], [], [], [], set()
        self.expect_run = ""
        self.settle()

    def choose(self) -> Callable[[], str]:
        if self.rng.random() < 0.18:
            return self.switch_tab
        table = {"Sample": self.sample_actions, "Photo": self.photo_actions, "Attention": self.attention_actions,
                 "Heads": self.heads_actions}[self.tab]()
        actions, weights = zip(*table)
        return self.rng.choices(actions, weights)[0]

    def settle(self) -> bool:
        """Wait until no job is queued or running and no progress is shown, QUIET_S long (at most SETTLE_S)."""
        end, quiet_since = time.monotonic() + SETTLE_S, None
        while time.monotonic() < end:
            if self.idle() and not self.page.evaluate(BUSY):
                quiet_since = quiet_since or time.monotonic()
                if time.monotonic() - quiet_since >= QUIET_S:
                    return True
            else:
                quiet_since = None
            time.sleep(0.1)
        return False

    def state(self) -> str:
        """What the page and server were doing when an action failed (a click that timed out: a result covered, gone
        or still loading), in one line."""
        shown = self.page.evaluate(STATE)
        under = " under an open preview" if shown["preview"] else ""
        return (f"the page then: status {shown['status']!r}, {shown['thumbs']} result(s) shown{under}, loading "
                f"overlays on {shown['pending'] or 'none'}, toasts {shown['toasts'] or 'none'}; the server "
                f"{'idle' if self.idle() else 'busy (a job queued or running)'}")

    def fail(self, problems: list[str]) -> None:
        shot = self.tmp / f"walk-seed{self.seed}-step{len(self.steps)}.png"
        self.page.screenshot(path=str(shot), full_page=True)
        steps = "\n".join(f"  {i + 1}. {s}" for i, s in enumerate(self.steps) if i >= self.segment)
        raise WalkFailure(
            f"click-walk seed {self.seed} failed after step {len(self.steps)}:\n"
            + "\n".join(f"  - {p}" for p in problems)
            + f"\nsteps (from a fresh page):\n{steps}\nscreenshot: {shot}\n"
            f"replay: DENOISER_WALK_SEED={self.seed} DENOISER_WALK_STEPS={len(self.steps)} "
            ".venv/bin/python -m pytest -x -q tests/app/test_walk.py")

    # ---- page helpers -----------------------------------------------------------------------------------------

    def block(self, key: str):
        """A visible block by elem_id, else by its label (a regex matched against the whole label)."""
        if re.fullmatch(r"[\w-]+", key):
            by_id = self.page.locator(f"#{key}")
            if by_id.count() and by_id.first.is_visible():
                return by_id.first
        info = self.page.locator("[data-testid=block-info]").filter(has_text=re.compile(rf"^\s*{key}\s*$"), visible=True)
        return info.first.locator("xpath=ancestor::div[contains(concat(' ', @class, ' '), ' block ')][1]")

    def values(self) -> dict[str, str]:
        """The visible controls' values, under their elem_id and under their label."""
        out = {}
        for b in self.page.evaluate(READ_BLOCKS):
            for key in (b["id"], b["label"]):
                if key:
                    out.setdefault(key, b["value"])
        return out

    def fill(self, key: str, value) -> None:
        box = self.block(key).locator("input[type=number], textarea, input[type=text], input[role=combobox]").first
        box.fill(str(value))
        box.press("Enter")

    def options(self, key: str) -> list[str]:
        """Open a dropdown; the texts of its options (left open)."""
        self.block(key).locator("input").first.click()
        options = self.block(key).get_by_role("option")
        try:
            options.first.wait_for(timeout=5_000)
        except Exception:  # noqa: BLE001 - no options: an empty list
            return []
        return [t.replace("✓", "").strip() for t in options.all_inner_texts()]

    def pick(self, key: str, name: str | None = None) -> str:
        """Choose an option of a dropdown (at random, or `name`); its text."""
        texts = self.options(key)
        if not texts:
            self.page.keyboard.press("Escape")
            return "(no options)"
        name = name if name in texts else self.rng.choice(texts)
        self.block(key).get_by_role("option").nth(texts.index(name)).click()
        self.page.keyboard.press("Escape")  # a multiselect stays open
        return name

    def files(self, gallery: str) -> list[str]:
        return self.page.evaluate(f"() => [...new Set([...document.querySelectorAll('#{gallery} button.thumbnail-item img')]"
                                  ".map(i => i.src))]")

    def settings(self, url: str) -> dict:
        """The settings the PNG at a gallery's URL carries, as the browser downloads it."""
        if url not in self.settings_cache:
            with urllib.request.urlopen(url, timeout=30) as answer:
                data = answer.read()
            with Image.open(io.BytesIO(data)) as img:
                self.settings_cache[url] = json.loads(img.text.get(SETTINGS_KEY, "{}")) if hasattr(img, "text") else {}
        return self.settings_cache[url]

    def number(self, lo: float, hi: float, step: float = 1.0) -> float | int:
        v = round(self.rng.uniform(lo, hi) / step) * step
        return int(v) if step >= 1 else round(v, 2)

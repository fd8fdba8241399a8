"""A seeded random click-walk over the app's four tabs (tests/test_app_walk.py runs it): a person's clicks, drawn
by weight from what each tab offers, and after each one the page settles and the invariants every state must keep
are checked, as STYLE.md's "The app's page tells the truth" puts them:

- no server traceback (the captured stderr, error records of any logger);
- no error toast but the messages the app means to give (ALLOWED), and no red "Error" pill anywhere;
- the Sample form shows what the last result was made with (its PNG's settings), where the walk has not changed it since;
- each status line describes its gallery (a "done" line its images, a stopped or refused run the pictures from before);
- every control holds a valid value (numbers in range, the model's own classes, a class selector for a model with classes).

A failure names the seed and the numbered actions so far: DENOISER_WALK_SEED=N DENOISER_WALK_STEPS=M replays them.
"""

from __future__ import annotations

import io
import json
import random
import re
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from PIL import Image

from denoiser.image_io import SETTINGS_KEY

__all__ = ["ALLOWED", "Walk", "WalkFailure"]

# The validation messages the app means to give, as a toast that stays until closed: a request it refuses, in words.
ALLOWED = [
    r"work units for this model, over the budget",  # over the work budget (denoiser.app.budget)
    r"is not one of this model's classes",  # a class typed that the model lacks
    r"is not one of this generation's \d+ attention layers",  # a layer typed into the Attention tab
    r"heads must be 'all' or comma-separated numbers",  # the Heads tab's heads text
    r"generate images first",  # a view of a generation before there is one
    r"click a pixel of the image first",  # "average the maps over every step" before a pixel is chosen
    r"choose at least one attention layer to switch off",
    r"an edit has no seed to repeat",  # switching layers off after an edit
    r"no safetensors weights|is not valid JSON|does not load",  # the two broken model folders the fixture serves
    r"upload a photo first|upload an image first",
    r"inpaint needs a mask|the mask is empty",  # inpaint without painting
    r"the new photo is still loading into the editor",
    r"a guidance interval (is two timesteps|needs timesteps)",  # the guidance-interval text
    r"unknown PAG layer",  # the PAG-layers text
    r"perturbed-attention guidance needs",
    r"pixel [xy] must be a whole number",  # pixel numbers typed outside the image
    r"over the work budget",
]
# text no message meant for a person holds: Python's own words for a failure
RAW = re.compile(r"Traceback|invalid literal|object has no attribute|NoneType|KeyError|IndexError|TypeError|"
                 r"list index|not subscriptable|unexpected keyword|positional argument|didn't return enough|"
                 r"upstream app has raised|exception", re.IGNORECASE)
MODELS_OWN = "(the model's)"
NO_CLASS = "(any)"
# the Sample form's controls as a result's PNG names them: (elem_id, label), the default a PNG leaves out
FORM = {"model": ("model", "model", None), "scheduler": ("scheduler", "scheduler", None), "steps": ("steps", "steps", None),
        "seed": ("seed", "seed", None), "num_images": ("num-images", "images", None), "class": ("class", "class", None),
        "guidance_scale": ("cfg", "guidance (with a class)", None), "pag_scale": ("pag", "attention guidance (PAG)", None),
        "timestep_spacing": ("spacing", "timestep spacing", MODELS_OWN), "eta": ("eta", "", 0.0),
        "guidance_interval": ("interval", "", ""), "pag_layers": ("pag-layers", "", ""),
        "prompt": ("prompt", "prompt", ""), "negative_prompt": ("negative-prompt", "", "")}  # a text model's
# what picking a model (its best) or a class (its guidance) sets on the form besides itself (layout._wire)
CASCADE = {"model": {"class", "guidance_scale", "scheduler", "steps", "pag_scale", "guide_scale", "prompt", "negative_prompt"},
           "class": {"guidance_scale"}}
TABS = ("Sample", "Edit", "Attention", "Heads")
SETTLE_S = 120  # the longest a settled action may take (a Generate of the walk's sizes on a busy 2-core machine)
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
# the errors a person sees: toasts (error or warning) with their text, and "Error" pills of status trackers
READ_ERRORS = """() => {
    const shown = e => e.offsetParent && getComputedStyle(e).display !== 'none' && getComputedStyle(e).visibility !== 'hidden';
    const toasts = [...document.querySelectorAll('.toast-body')].filter(shown).map(t => ({
        kind: t.className.includes('error') ? 'error' : t.className.includes('warning') ? 'warning' : 'info',
        text: [...t.querySelectorAll('.toast-message-text, .toast-text')].map(m => m.innerText).join(' | ') || t.innerText}));
    const pills = [...document.querySelectorAll('[data-testid=status-tracker] .error')].filter(shown).map(p => {
        const owner = p.closest('[id]'); return owner ? owner.id || '?' : '?'; });
    return {toasts, pills};
}"""
# a job is shown as running: a status tracker's progress, eta or queue text
BUSY = """() => [...document.querySelectorAll('[data-testid=status-tracker]')].some(t => t.offsetParent &&
    t.querySelector('.progress-text, .meta-text, .meta-text-center, .eta-bar, .progress-level'))"""


@dataclass
class Walk:
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
    edit_gallery: list = field(default_factory=list)
    before_run: list = field(default_factory=list)  # the Sample results before the last Generate
    before_edit: list = field(default_factory=list)  # the Edit results before the last Run
    edit_touched: set = field(default_factory=set)  # Edit controls changed since its last result
    earlier_pick: int = 0  # the earlier result last clicked
    settings_cache: dict = field(default_factory=dict)
    segment: int = 0  # the first step since the page was last (re)loaded
    runs: list = field(default_factory=list)  # the settings of each Sample run seen, for the earlier results

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
            self.fail([f"the action could not be done: {str(err).splitlines()[0][:300]}"])
        if not self.settle():
            self.fail([f"the page did not settle within {SETTLE_S} s (a job still queued or running)"])
        self.check()

    def restart(self) -> None:
        """After a failure (keep_going): the page reloaded, a fresh session whose state the walk knows again."""
        self.page.reload()
        self.page.wait_for_function("() => { const c = document.querySelector('#class input'); "
                                    "return c && c.value && c.value !== '(any)'; }", timeout=60_000)
        self.steps.append("(reload the page: a fresh session)")
        self.segment = len(self.steps)
        # (the runs seen stay: the browser keeps its earlier results over a reload)
        self.tab, self.reference, self.touched, self.typed = "Sample", None, set(), {}
        self.gallery, self.edit_gallery, self.before_run, self.before_edit, self.edit_touched = [], [], [], [], set()
        self.settle()

    def choose(self) -> Callable[[], str]:
        if self.rng.random() < 0.18:
            return self.switch_tab
        table = {"Sample": self.sample_actions, "Edit": self.edit_actions, "Attention": self.attention_actions,
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

    def fail(self, problems: list[str]) -> None:
        shot = self.tmp / f"walk-seed{self.seed}-step{len(self.steps)}.png"
        self.page.screenshot(path=str(shot), full_page=True)
        steps = "\n".join(f"  {i + 1}. {s}" for i, s in enumerate(self.steps) if i >= self.segment)
        raise WalkFailure(
            f"click-walk seed {self.seed} failed after step {len(self.steps)}:\n"
            + "\n".join(f"  - {p}" for p in problems)
            + f"\nsteps (from a fresh page):\n{steps}\nscreenshot: {shot}\n"
            f"replay: DENOISER_WALK_SEED={self.seed} DENOISER_WALK_STEPS={len(self.steps)} "
            ".venv/bin/python -m pytest -x -q tests/test_app_walk.py")

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

    # ---- actions: moving between tabs -------------------------------------------------------------------------

    def switch_tab(self) -> str:
        name = self.rng.choice([t for t in TABS if t != self.tab])
        self.page.get_by_role("tab", name=name, exact=True).click()
        self.tab = name
        return f"open the {name} tab"

    # ---- actions: Sample tab ----------------------------------------------------------------------------------

    def sample_actions(self) -> list:
        return [(self.pick_model, 3), (self.pick_class, 3), (self.type_class, 1), (self.move_slider, 8), (self.type_seed, 1),
                (self.dice, 1), (self.advanced, 2), (self.generate, 8), (self.generate_and_stop, 2), (self.try_row, 2),
                (self.select_result, 2), (self.use_settings, 2), (self.use_earlier, 1)]

    def _touch(self, name: str) -> None:
        self.touched |= {name} | CASCADE.get(name, set())

    def pick_model(self) -> str:
        loading = [m for m, c in self.models.items() if c is not None]
        broken = [m for m, c in self.models.items() if c is None]
        name = self.rng.choice(broken) if broken and self.rng.random() < 0.1 else self.rng.choice(loading)
        chosen = self.pick("model", name)
        self._touch("model")
        self.typed.pop("class", None)
        return f"pick model {chosen!r}"

    def pick_class(self) -> str:
        if not self.page.locator("#class").is_visible():
            return "(no class selector: the model has no classes)"
        chosen = self.pick("class")
        self._touch("class")
        return f"pick class {chosen!r}"

    def type_class(self) -> str:
        text = self.rng.choice(["zzz", "1", NO_CLASS, "circle"])
        if not self.page.locator("#class").is_visible():
            return "(no class selector: the model has no classes)"
        self.fill("class", text)
        self._touch("class")
        self.typed["class"] = text
        return f"type {text!r} into class"

    def move_slider(self) -> str:
        key, name, value = self.rng.choice([
            ("steps", "steps", self.number(1, 8) if self.rng.random() < 0.9 else self.rng.choice([30, 1000])),
            ("num-images", "num_images", self.number(1, 4) if self.rng.random() < 0.9 else self.rng.choice([16, 64])),
            ("cfg", "guidance_scale", self.number(1, 4, 0.5)),
            ("pag", "pag_scale", self.number(0, 2, 0.25)),
        ])
        self.fill(key, value)
        self.touched.add(name)
        return f"set {key} to {value}"

    def type_seed(self) -> str:
        value = self.rng.choice([0, 1, 7, 12345, 2**32 - 1])
        self.fill("seed", value)
        self.touched.add("seed")
        return f"type seed {value}"

    def dice(self) -> str:
        self.page.get_by_role("button", name=re.compile("randomise")).click()
        self.touched.add("seed")
        return "click 🎲 randomise"

    def advanced(self) -> str:
        """One of the folded-away settings (the accordion opened first)."""
        if not self.page.locator("#spacing").is_visible():
            self.page.locator("#advanced").get_by_role("button").first.click()
            self.page.locator("#spacing").wait_for(timeout=10_000)
        key, name, text = self.rng.choice([
            ("interval", "guidance_interval", self.rng.choice(["zzz", "70, 550", "", "900, 100"])),
            ("pag-layers", "pag_layers", self.rng.choice(["zzz", "mid_attn", ""])),
            ("eta", "eta", self.rng.choice([0, 0.5, 1])),
            ("spacing", "timestep_spacing", None),
        ])
        if text is None:
            text = self.pick("spacing")
        else:
            self.fill(key, text)
        self.touched.add(name)
        return f"set {key} (advanced) to {text!r}"

    def generate(self) -> str:
        self.before_run = self.files("gallery")
        self.page.locator("#generate").click()
        return "click Generate"

    def generate_and_stop(self) -> str:
        """A long run stopped part-way: many steps, then Stop after a moment."""
        for key, name, value in (("steps", "steps", 400), ("num-images", "num_images", 8)):
            self.fill(key, value)
            self.touched.add(name)
        self.before_run = self.files("gallery")
        self.page.locator("#generate").click()
        wait = self.rng.uniform(0.3, 3.0)
        time.sleep(wait)
        self.page.locator("#stop").click()
        return f"set steps 400, images 8, click Generate, click Stop after {wait:.1f} s"

    def try_row(self) -> str:
        rows = self.page.get_by_text("try these").locator("xpath=ancestor::div[contains(@class,'block')][1]").locator("tbody tr")
        if not rows.count():
            return "no 'try these' rows"
        k = self.rng.randrange(rows.count())
        self.before_run = self.files("gallery")
        rows.nth(k).click()
        self.typed.pop("class", None)
        return f"click 'try these' row {k + 1}"

    def select_result(self) -> str:
        thumbs = self.page.locator("#gallery button.thumbnail-item")
        if not thumbs.count():
            return "no result to select"
        k = self.rng.randrange(thumbs.count())
        thumbs.nth(k).click()
        self.page.keyboard.press("Escape")
        return f"click result {k + 1}"

    def use_settings(self) -> str:
        self.page.locator("#use-settings").click()
        return "click 'use these settings'"

    def use_earlier(self) -> str:
        thumbs = self.page.locator("#earlier button.thumbnail-item")
        if not thumbs.count() or not self.page.locator("#use-earlier").is_visible():
            return "no earlier results"
        self.earlier_pick = self.rng.randrange(thumbs.count())
        thumbs.nth(self.earlier_pick).click()
        self.page.keyboard.press("Escape")
        self.page.locator("#use-earlier").click()
        return f"click earlier result {self.earlier_pick + 1}, then its 'use these settings'"

    # ---- actions: Edit tab ------------------------------------------------------------------------------------

    def edit_actions(self) -> list:
        return [(self.example_picture, 3), (self.upload_result, 2), (self.upload_photo, 1), (self.operation, 3),
                (self.edit_model, 2), (self.edit_slider, 3), (self.edit_run, 6), (self.edit_run_and_stop, 2)]

    def _photo_input(self, path: Path) -> None:
        clear = self.page.locator("#photo").get_by_role("button", name="Clear")
        if clear.count():
            clear.first.click()
        self.page.locator("#photo input[type=file]").set_input_files(str(path))

    def example_picture(self) -> str:
        column = self.page.locator("#photo").locator("xpath=ancestor::div[contains(@class,'column')][1]")
        items = column.locator(".gallery-item, tbody tr")
        if not items.count():
            return "no example pictures"
        k = self.rng.randrange(items.count())
        items.nth(k).click()
        return f"click example picture {k + 1}"

    def upload_result(self) -> str:
        """A generated PNG, as downloaded from the Sample gallery, uploaded as the photo."""
        if not self.gallery:
            return self.upload_photo()
        url = self.rng.choice(self.gallery)
        path = self.tmp / f"result-{len(self.steps)}.png"
        with urllib.request.urlopen(url, timeout=30) as answer:
            path.write_bytes(answer.read())
        self._photo_input(path)
        return f"upload the generated {url.rsplit('/', 1)[-1]}"

    def upload_photo(self) -> str:
        w, h = self.rng.choice([(40, 30), (16, 16), (300, 200)])
        path = self.tmp / f"photo-{len(self.steps)}.png"
        rng = random.Random(len(self.steps))
        Image.frombytes("RGB", (w, h), bytes(rng.randrange(256) for _ in range(w * h * 3))).save(path)
        self._photo_input(path)
        return f"upload a {w}x{h} noise photo"

    def operation(self) -> str:
        op = self.rng.choice(["denoise", "denoise (sampled)", "edit", "inpaint"])
        self.page.get_by_role("radio", name=op, exact=True).check()
        self.edit_touched.add("operation")
        return f"choose operation {op!r}"

    def edit_model(self) -> str:
        loading = [m for m, c in self.models.items() if c is not None]
        chosen = self.pick("edit-model", self.rng.choice(loading))
        self.edit_touched.add("model")
        return f"pick Edit model {chosen!r}"

    def edit_slider(self) -> str:
        key, value = self.rng.choice([
            ("sigma", self.number(0, 0.3, 0.01)), ("strength", self.number(0.05, 1, 0.05)),
            (r"add noise.*", self.rng.choice([0, 0, 0.1, 0.3])), (r"steps \(.*", self.number(1, 8)),
        ])
        block = self.block(key)
        if not block.count() or not block.is_visible():
            return f"({key} not shown)"
        self.fill(key, value)
        self.edit_touched.add(key)
        return f"set {key.split(' ')[0].rstrip('.*')} to {value}"

    def edit_run(self) -> str:
        self.before_edit = self.files("edit-result")
        self.page.locator("#edit-run").click()
        return "click Run"

    def edit_run_and_stop(self) -> str:
        """An edit of a long chain stopped part-way (sampled denoise stops early on a clean picture: edit does not)."""
        self.page.get_by_role("radio", name="edit", exact=True).check()
        self.page.locator("#strength").wait_for(state="visible", timeout=10_000)
        self.fill("strength", 1)
        self.fill(r"steps \(.*", 600)
        self.edit_touched |= {"operation", "strength", "steps"}
        self.before_edit = self.files("edit-result")
        self.page.locator("#edit-run").click()
        wait = self.rng.uniform(0.3, 3.0)
        time.sleep(wait)
        self.page.locator("#edit-stop").click()
        return f"choose operation 'edit', set strength 1, steps 600, click Run, click Stop after {wait:.1f} s"

    # ---- actions: Attention tab -------------------------------------------------------------------------------

    def attention_actions(self) -> list:
        return [(self.click_image, 5), (self.attention_slider, 3), (self.pick_layer, 2), (self.type_layer, 1),
                (self.pick_head, 2), (self.mean_maps, 1), (self.mean_maps_and_stop, 1), (self.show_pixel, 1)]

    def click_image(self) -> str:
        image = self.page.locator("#clickable img")
        if not image.count():
            return "no image to click"
        fx, fy = self.rng.random(), self.rng.random()
        box = image.bounding_box()
        image.click(position={"x": box["width"] * fx, "y": box["height"] * fy})
        return f"click the image at ({fx:.2f}, {fy:.2f})"

    def attention_slider(self) -> str:
        key = self.rng.choice(["image", "denoising step"])
        block = self.block(key)
        if not block.count() or not block.is_visible():
            return f"({key} slider not shown)"
        hi = float(block.locator("input[type=range]").get_attribute("max") or 1)
        value = self.rng.randint(0, int(hi))
        self.fill(key, value)
        return f"set {key} to {value}"

    def pick_layer(self) -> str:
        return f"pick layer {self.pick('layer')!r}"

    def type_layer(self) -> str:
        text = self.rng.choice(["zzz", "1", "99"])
        self.fill("layer", text)
        self.typed["layer"] = text
        return f"type {text!r} into layer"

    def pick_head(self) -> str:
        return f"pick head {self.pick('head')!r}"

    def mean_maps(self) -> str:
        self.page.locator("#mean-run").click()
        return "click 'average the maps over every step'"

    def mean_maps_and_stop(self) -> str:
        self.page.locator("#mean-run").click()
        wait = self.rng.uniform(0.2, 1.5)
        time.sleep(wait)
        self.page.locator("#mean-stop").click()
        return f"click 'average the maps over every step', click its Stop after {wait:.1f} s"

    def show_pixel(self) -> str:
        y, x = self.rng.choice([(0, 0), (3, 5), (15, 15), (40, 2)])
        self.fill("pixel y", y)
        self.fill("pixel x", x)
        self.page.get_by_role("button", name="show", exact=True).click()
        return f"type pixel ({y}, {x}), click show"

    # ---- actions: Heads tab -----------------------------------------------------------------------------------

    def heads_actions(self) -> list:
        return [(self.stats, 3), (self.stats_and_stop, 1), (self.off_layers, 2), (self.off_heads, 1), (self.switch_off, 2)]

    def stats(self) -> str:
        self.page.locator("#stats-run").click()
        return "click Compute statistics"

    def stats_and_stop(self) -> str:
        self.page.locator("#stats-run").click()
        wait = self.rng.uniform(0.2, 1.5)
        time.sleep(wait)
        self.page.locator("#stats-stop").click()
        return f"click Compute statistics, click its Stop after {wait:.1f} s"

    def off_layers(self) -> str:
        return f"choose layer {self.pick('off-layers')!r} to switch off"

    def off_heads(self) -> str:
        text = self.rng.choice(["all", "0", "0,1", "zzz"])
        self.fill("off-heads", text)
        return f"type {text!r} into heads to switch off"

    def switch_off(self) -> str:
        self.page.locator("#off-run").click()
        return "click Switch off and regenerate"

    # ---- invariants -------------------------------------------------------------------------------------------

    def check(self) -> None:
        problems = self.check_log() + self.check_errors()
        values = self.values()
        problems += self.check_controls(values)
        problems += self.check_sample(values) + self.check_edit(values) + self.check_attention(values)
        if problems:
            self.fail(problems)

    def check_log(self) -> list[str]:
        text = self.server_log()
        if "Traceback" in text or re.search(r"\bERROR\b", text):
            return [f"the server logged an error:\n{text[-3000:]}"]
        return []

    def check_errors(self) -> list[str]:
        """Toasts and pills; an allowed toast is closed once seen (it stays until closed)."""
        found, problems = self.page.evaluate(READ_ERRORS), []
        for toast in found["toasts"]:
            text = toast["text"]
            if RAW.search(text) or not any(re.search(p, text) for p in ALLOWED):
                problems.append(f"{toast['kind']} toast not among the app's messages: {text[:300]!r}")
        problems += [f"a red 'Error' pill on #{owner}" for owner in found["pills"]]
        if not problems:
            for close in self.page.locator(".toast-close").all():
                if close.is_visible():
                    close.click()
        return problems

    def check_controls(self, v: dict) -> list[str]:
        problems = []

        def number(key, lo, hi, whole=True):
            if key not in v:
                return
            try:
                x = float(v[key])
            except (TypeError, ValueError):
                problems.append(f"{key} shows {v[key]!r}, not a number")
                return
            if not lo <= x <= hi or (whole and not x.is_integer()):
                problems.append(f"{key} shows {v[key]!r}, outside {lo}..{hi}{' (whole numbers)' if whole else ''}")

        if self.tab == "Sample":
            unread = [name for name in ("model", "scheduler", "steps", "seed", "num_images", "guidance_scale", "pag_scale")
                      if FORM[name][0] not in v and FORM[name][1] not in v]
            if unread:  # a control renamed or moved: the walk must learn its new name, or it checks nothing
                problems.append(f"the walk cannot read the Sample tab's {', '.join(unread)} (elem_id or label changed?)")
            number("steps", 1, 1000)
            number("num-images", 1, 64)
            number("seed", 0, 2**32 - 1)
            number("cfg", 1, 10, whole=False)
            number("pag", 0, 10, whole=False)
            problems += self.check_class(v.get("model"), "class", v)
        if self.tab == "Edit":
            number("edit-cfg", 1, 10, whole=False)
            number("sigma", 0, 1, whole=False)
            number("strength", 0.01, 1, whole=False)
            problems += self.check_class(v.get("edit-model"), "edit-class", v)
        if self.tab == "Attention":
            if self.page.locator("#clickable img").count() and v.get("layer") in (None, ""):
                problems.append("the Attention tab shows an image but no layer")
            if v.get("head") not in (None, "") and not str(v["head"]).isdigit():
                problems.append(f"head shows {v['head']!r}")
        return problems

    def check_class(self, model, key: str, v: dict) -> list[str]:
        """A model with classes shows its class selector, holding one of them, "(any)" or what the walk typed."""
        if model not in self.models:
            return [f"the model selector shows {model!r}, not one of {sorted(self.models)}"] if model is not None else []
        classes = self.models[model] or []
        if bool(classes) != (key in v):
            return [f"{model!r} has classes {classes}, but the class selector is {'shown' if key in v else 'hidden'}"]
        if key in v and v[key] not in [NO_CLASS, *classes, self.typed.get(key)]:
            return [f"the class selector shows {v[key]!r}, not a class of {model!r} ({classes})"]
        return []

    def check_sample(self, v: dict) -> list[str]:
        """The Sample tab's status line against its gallery, and its form against the result it was made from."""
        if self.tab != "Sample":
            return []
        files, status = self.files("gallery"), self.page.locator("#status").inner_text().strip()
        problems = []
        if files and files != self.gallery:  # a new result: the form shows what it was made with
            self.reference, self.touched = self.settings(files[0]), set()
            problems += self._earlier_problems(self.reference)
        self.gallery = files
        done = re.match(r"done: (\d+) image\(s\)(?: of “.*”)?, (\d+) steps", status, re.DOTALL)
        if done:
            n, steps = map(int, done.groups())
            made = self.settings(files[0]) if files else {}
            if len(files) != n or made.get("count") != n or made.get("steps") != steps:
                problems.append(f"the status says {status!r}, the gallery shows {len(files)} image(s) made with "
                                f"{made.get('steps')} steps")
        elif re.search(r"stopped at step|not started", status):
            if files != self.before_run:
                problems.append(f"the status says {status[:120]!r} (the results from the run before), but the gallery "
                                f"changed from {self._names(self.before_run)} to {self._names(files)}")
        elif "restored" in status:
            name = re.search(r"settings of (\S+) restored", status)
            earlier = self.files("earlier")
            picked = [f for f in files + earlier if name and f.endswith("/" + name.group(1))]
            if not picked:
                problems.append(f"the status says {status!r}, a result not shown")
            elif self.steps and "use these settings" in self.steps[-1]:
                source = earlier[self.earlier_pick] if "earlier" in self.steps[-1] and earlier else picked[0]
                self.reference, self.touched = self.settings(source), set()
        elif status.startswith("generate first") and files:
            problems.append(f"the status says {status!r} over {len(files)} results")
        elif status and not status.startswith("generate first"):
            problems.append(f"the status line says {status[:200]!r}, which describes no gallery state")
        if self.reference:
            problems += self._form_problems(v)
        return problems

    def _form_problems(self, v: dict) -> list[str]:
        problems = []
        for name, (elem_id, label, default) in FORM.items():
            if name in self.touched:
                continue
            shown = v.get(elem_id, v.get(label)) if label else v.get(elem_id)
            if shown is None:  # not on screen (the advanced settings folded away)
                continue
            made = self.reference.get(name, default)
            if name == "class":
                made = made or NO_CLASS
            if not _same(shown, made):
                problems.append(f"the form shows {name} = {shown!r}, the result it describes was made with {made!r} "
                                f"({self.reference.get('model')}, seed {self.reference.get('seed')})")
        return problems

    def _earlier_problems(self, made: dict) -> list[str]:
        """The earlier results are those before the current ones: a run made once is not among them."""
        run = {k: v for k, v in made.items() if k not in ("index", "count")}
        self.runs.append(run)
        if self.runs.count(run) > 1:
            return []
        for url in self.files("earlier"):
            if {k: v for k, v in self.settings(url).items() if k not in ("index", "count")} == run:
                return [f"the earlier results repeat the current ones ({url.rsplit('/', 1)[-1]})"]
        return []

    def check_attention(self, v: dict) -> list[str]:
        """The four stages' text names the layer, head and step the selectors show."""
        if self.tab != "Attention":
            return []
        text = self.page.locator("#stage-text [data-testid=markdown]").inner_text().strip()
        said = re.match(r"(.+?), head (\d+) — .*? step (\d+) \(t = ", text, re.DOTALL)
        if not text or said is None:
            return [f"the stages' text reads {text[:120]!r}"] if text else []
        shown = (v.get("layer"), v.get("head"), v.get("denoising step", "0"))
        if shown[0] in self.typed.values():  # refused text: the views stay at the layer before
            return []
        if tuple(map(str, said.groups())) != tuple(str(x).strip() for x in shown):
            return [f"the four stages show layer {said[1]}, head {said[2]}, step {said[3]}; the selectors say layer "
                    f"{shown[0]!r}, head {shown[1]!r}, step {shown[2]!r}"]
        return []

    def check_edit(self, v: dict) -> list[str]:
        """The Edit tab's status line against its gallery and the controls it ran with."""
        if self.tab != "Edit":
            return []
        files, status = self.files("edit-result"), self.page.locator("#edit-status").inner_text().strip()
        problems = []
        if files != self.edit_gallery and re.match(r"done: ", status):
            self.edit_touched = set()
        self.edit_gallery = files
        done = re.match(r"done: (.+?) with (\S+?),", status)
        if done:
            op, model = done.groups()
            if len(files) < 2:
                problems.append(f"the Edit status says {status!r}, its gallery shows {len(files)} picture(s)")
            if "model" not in self.edit_touched and v.get("edit-model") != model:
                problems.append(f"the Edit status says {status!r}, the Edit model shows {v.get('edit-model')!r}")
            if "operation" not in self.edit_touched and v.get("operation") != op:
                problems.append(f"the Edit status says {status!r}, the operation shows {v.get('operation')!r}")
        elif re.search(r"stopped at step|not started", status) and files != self.before_edit:
            problems.append(f"the Edit status says {status[:120]!r} (the results from the run before), but its gallery "
                            f"changed from {len(self.before_edit)} to {len(files)} picture(s)")
        return problems

    @staticmethod
    def _names(files: list[str]) -> list[str]:
        return [f.rsplit("/", 1)[-1] for f in files][:3] + (["..."] if len(files) > 3 else [])


def _same(shown, made) -> bool:
    """A control's text equals a setting's value (numbers compared as numbers)."""
    try:
        return abs(float(shown) - float(made)) < 1e-6
    except (TypeError, ValueError):
        return str(shown) == str("" if made is None else made)

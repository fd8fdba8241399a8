"""The actions of tests/app/walk.py's walk: a person's clicks on each of the app's four tabs, each returning what it
did in words (the replay's numbered list). A mixin of `Walk`, which supplies the page, the random draws and the
page helpers (fill, pick, options, number).
"""

from __future__ import annotations

import random
import time
import urllib.request
from pathlib import Path

from PIL import Image

from tests.app.browser import RESULTS, click_result
from tests.app.walk_checks import NO_CLASS, PANEL

__all__ = ["TABS", "WATCH_STATUS", "WalkActions"]

# what picking a model (its best) or a class (its guidance) sets on the form besides itself (layout._wire)
CASCADE = {"model": {"class", "guidance_scale", "scheduler", "steps", "pag_scale", "guide_scale", "prompt", "negative_prompt"},
           "class": {"guidance_scale"}}
# what a "try these" row sets on the Sample form: its columns, and the advanced settings back to the model's own
ROW_FIELDS = ("model", "scheduler", "steps", "seed", "num_images", "class", "guidance_scale", "pag_scale", "guide_scale",
              "prompt", "timestep_spacing", "eta", "guidance_interval", "pag_layers", "negative_prompt")
TABS = ("Sample", "Photo", "Attention", "Heads")
# a text model's prompts the walk types: plain, weighted, a weight that does not read, none
PROMPTS = ["red apple", "(red:1.5) apple", "[red] (apple:0.5)", "(red:x) apple", "red (apple", ""]
# the edited prompts of a word edit: a word swapped, a word added, weighted, one the edit refuses, the same
EDITED = ["blue apple", "red apple tree", "(blue:2) apple", "blue apple on a tree", "red apple", ""]
# numbers Generate refuses in words, typed or pasted: (elem_id, the text, the control's name in the message, FORM's)
OUT_OF_RANGE = [("steps", "-5", "steps", "steps"), ("steps", "0", "steps", "steps"), ("steps", "1e9", "steps", "steps"),
                ("seed", "-1", "seed", "seed"), ("seed", "1e20", "seed", "seed"),
                ("num-images", "1000", "number of images", "num_images"),
                ("num-images", "-3", "number of images", "num_images"), ("num-images", "0", "number of images", "num_images")]
STOP_GAPS = [0.0, 0.05, 0.1, 0.2, 0.3]  # seconds from Stop to the next Generate (issue 51 item 1)
# every text the Sample status line shows from now on, in window.walkStatusSeen (a run the same as the one before gives
# the same files at the same addresses: its progress line is what tells that it ran)
WATCH_STATUS = """() => { window.walkStatusSeen = []; const s = document.querySelector('#status');
    new MutationObserver(() => window.walkStatusSeen.push(s.innerText)).observe(s, {subtree: true, childList: true,
                                                                                 characterData: true}); }"""


class WalkActions:
    """The actions of `Walk` (tests/app/walk.py), drawn by weight from `<tab>_actions()`."""

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
                (self.select_result, 2), (self.use_settings, 2), (self.use_earlier, 1), (self.type_prompt, 2),
                (self.word_edit, 3), (self.stop_then_generate, 2), (self.out_of_range, 2), (self.example_prompt, 1)]

    def _touch(self, name: str) -> None:
        self.touched |= {name} | CASCADE.get(name, set())

    def stop_after(self, stop: str, low: float, high: float) -> float:
        """A job just started: wait a random moment in [low, high] s, then click its Stop button `stop` (a selector).
        Returns the wait."""
        wait = self.rng.uniform(low, high)
        time.sleep(wait)
        self.page.locator(stop).click()
        return wait

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
        self.page.get_by_role("button", name="random seed").click()
        self.touched.add("seed")
        return "click random seed"

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
        wait = self.stop_after("#stop", 0.3, 3.0)
        return f"set steps 400, images 8, click Generate, click Stop after {wait:.1f} s"

    def stop_then_generate(self) -> str:
        """Generate, Stop after a moment, Generate again at once: the second press runs (checked: check_sample)."""
        for key, name, value in (("steps", "steps", 200), ("num-images", "num_images", 2)):
            self.fill(key, value)
            self.touched.add(name)
        before = self.files("gallery")
        self.page.locator("#generate").click()
        wait, gap = self.rng.uniform(0.5, 3.0), self.rng.choice(STOP_GAPS)
        time.sleep(wait)
        self.page.locator("#stop").click()
        time.sleep(gap)
        self.page.evaluate(WATCH_STATUS)
        self.before_run = self.files("gallery")
        self.page.locator("#generate").click()
        if self.before_run != before:  # the first run ended before Stop: the second makes the same (its earlier results)
            self.runs.append({k: v for k, v in self.settings(self.before_run[0]).items() if k not in ("index", "count")})
        self.expect_run = f"Generate pressed {gap} s after Stop"
        return f"set steps 200, images 2, click Generate, click Stop after {wait:.1f} s, click Generate {gap} s later"

    def out_of_range(self) -> str:
        """A number out of range typed (key by key) or pasted (one input), then Generate: one message in words, the
        status "not started: …", nothing runs; then a valid number back."""
        key, text, name, field = self.rng.choice(OUT_OF_RANGE)
        box = self.block(key).locator("input[type=number]").first
        pasted = self.rng.random() < 0.5
        box.fill("")
        if pasted:
            box.focus()
            self.page.keyboard.insert_text(text)  # as a paste puts it in: the whole text at once
        else:
            box.press_sequentially(text, delay=20)
        box.press("Enter")
        self.page.wait_for_timeout(300)
        self.before_run = self.files("gallery")
        self.page.locator("#generate").click()
        self.page.wait_for_function("() => document.querySelector('#status').innerText.startsWith('not started')",
                                    timeout=30_000)
        status = self.page.locator("#status").inner_text()
        assert f"{name} must be a whole number" in status, f"{text!r} in {key}: the status says {status[:200]!r}"
        self.page.wait_for_timeout(800)  # a run the refusal did not stop would have started by now
        assert self.files("gallery") == self.before_run, f"{text!r} in {key}: the gallery changed"
        toasts = self.page.locator(".toast-body").filter(has_text="must be a whole number")
        assert toasts.count() == 1, f"{text!r} in {key}: {toasts.count()} messages: {toasts.all_inner_texts()}"
        valid = {"steps": self.number(1, 8), "seed": self.number(0, 999), "num-images": self.number(1, 4)}[key]
        self.fill(key, valid)
        self.touched.add(field)
        return (f"{'paste' if pasted else 'type'} {text!r} into {key}, click Generate: refused in words, nothing ran; "
                f"set {key} back to {valid}")

    def example_prompt(self) -> str:
        """A text model's example prompt clicked (the model folder's, or the app's)."""
        if not self.page.locator("#prompt-examples").is_visible():
            return "(no example prompts: the model takes no text)"
        items = self.page.locator("#prompt-examples").get_by_role("button").filter(visible=True)
        if not items.count():
            return "(no example prompts shown)"
        k = self.rng.randrange(items.count())
        text = items.nth(k).inner_text().strip()
        items.nth(k).click()
        self.touched.add("prompt")
        return f"click the example prompt {text!r}"

    def try_row(self) -> str:
        rows = self.page.get_by_text("try these").locator("xpath=ancestor::div[contains(@class,'block')][1]").locator("tbody tr")
        if not rows.count():
            return "no 'try these' rows"
        k = self.rng.randrange(rows.count())
        self.before_run = self.files("gallery")
        rows.nth(k).click()
        self.typed.pop("class", None)
        # the row fills the form, then generates; a run refused (the queue full, a model that does not load) leaves
        # the row's settings in the form over the results from before (seed 9, step 92)
        self.touched |= set(ROW_FIELDS)
        return f"click 'try these' row {k + 1}"

    def click_result(self, gallery: str) -> int | None:
        """Click a result in a gallery's grid, its preview opened and closed again (click_result): the index clicked,
        None when the gallery is empty."""
        count = self.page.locator(f"#{gallery} {RESULTS}").count()
        if not count:
            return None
        k = self.rng.randrange(count)
        click_result(self.page, gallery, k)
        return k

    def select_result(self) -> str:
        k = self.click_result("gallery")
        return "no result to select" if k is None else f"click result {k + 1}"

    def use_settings(self) -> str:
        self.page.locator("#use-settings").click()
        return "click 'use these settings'"

    def use_earlier(self) -> str:
        k = self.click_result("earlier") if self.page.locator("#use-earlier").is_visible() else None
        if k is None:
            return "no earlier results"
        self.earlier_pick = k
        self.page.locator("#use-earlier").click()
        return f"click earlier result {self.earlier_pick + 1}, then its 'use these settings'"

    def type_prompt(self) -> str:
        """A text model's prompt: plain, weighted, or with a weight that does not read."""
        if not self.page.locator("#prompt").is_visible():
            return "(no prompt box: the model takes no text)"
        text = self.rng.choice(PROMPTS)
        self.fill("prompt", text)
        self.touched.add("prompt")
        return f"type {text!r} into prompt"

    def word_edit(self) -> str:
        """Change the selected result's words: an edited prompt, an edit type, the two fractions, run."""
        if not self.page.locator("#word-edit").is_visible():
            return "(no word edit: no text model's result shown)"
        text = self.rng.choice(EDITED)
        self.page.locator("#word-edit-prompt textarea").fill(text)
        kind = self.rng.choice(["replace", "refine"])
        self.page.locator("#word-edit-type").get_by_text(kind, exact=True).click()
        cross, self_ = self.number(0, 1, 0.05), self.number(0, 1, 0.05)
        self.fill("cross-replace", cross)
        self.fill("self-replace", self_)
        self.touched |= set(PANEL)
        self.before_run = self.files("gallery")
        self.page.locator("#word-edit-run").click()
        return f"change the words to {text!r} ({kind}, word maps {cross}, layout {self_}), click 'change the words'"

    # ---- actions: Photo tab ------------------------------------------------------------------------------------

    def photo_actions(self) -> list:
        return [(self.example_picture, 3), (self.upload_result, 2), (self.upload_photo, 1), (self.operation, 3),
                (self.photo_model, 2), (self.photo_slider, 3), (self.photo_run, 6), (self.photo_run_and_stop, 2)]

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
        self.photo_touched.add("operation")
        return f"choose operation {op!r}"

    def photo_model(self) -> str:
        loading = [m for m, c in self.models.items() if c is not None]
        chosen = self.pick("photo-model", self.rng.choice(loading))
        self.photo_touched.add("model")
        return f"pick Photo model {chosen!r}"

    def photo_slider(self) -> str:
        key, value = self.rng.choice([
            ("sigma", self.number(0, 0.3, 0.01)), ("strength", self.number(0.05, 1, 0.05)),
            (r"add noise.*", self.rng.choice([0, 0, 0.1, 0.3])), (r"steps \(.*", self.number(1, 8)),
        ])
        block = self.block(key)
        if not block.count() or not block.is_visible():
            return f"({key} not shown)"
        self.fill(key, value)
        self.photo_touched.add(key)
        return f"set {key.split(' ')[0].rstrip('.*')} to {value}"

    def photo_run(self) -> str:
        self.before_photo = self.files("photo-result")
        self.page.locator("#photo-run").click()
        return "click Run"

    def photo_run_and_stop(self) -> str:
        """An edit of a long chain stopped part-way (sampled denoise stops early on a clean picture: edit does not)."""
        self.page.get_by_role("radio", name="edit", exact=True).check()
        self.page.locator("#strength").wait_for(state="visible", timeout=10_000)
        self.fill("strength", 1)
        self.fill(r"steps \(.*", 600)
        self.photo_touched |= {"operation", "strength", "steps"}
        self.before_photo = self.files("photo-result")
        self.page.locator("#photo-run").click()
        wait = self.stop_after("#photo-stop", 0.3, 3.0)
        return f"choose operation 'edit', set strength 1, steps 600, click Run, click Stop after {wait:.1f} s"

    # ---- actions: Attention tab -------------------------------------------------------------------------------

    def attention_actions(self) -> list:
        return [(self.click_image, 5), (self.attention_slider, 3), (self.pick_layer, 2), (self.type_layer, 1),
                (self.pick_head, 2), (self.mean_maps, 1), (self.mean_maps_and_stop, 1), (self.show_pixel, 1),
                (self.pick_word, 2)]

    def pick_word(self) -> str:
        words = self.page.locator("#words label")
        if not self.page.locator("#words").is_visible() or not words.count():
            return "(no words: the generation has no prompt)"
        k = self.rng.randrange(words.count())
        name = words.nth(k).inner_text().strip()
        words.nth(k).click()
        return f"click the word {name!r}"

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
        wait = self.stop_after("#mean-stop", 0.2, 1.5)
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
        wait = self.stop_after("#stats-stop", 0.2, 1.5)
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

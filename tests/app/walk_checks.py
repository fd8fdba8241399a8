"""The invariants tests/app/walk.py's walk checks after every action: no server traceback, no error toast but the
messages the app means to give (ALLOWED) and no red "Error" pill, the Sample form showing what its last result was
made with, each status line describing its gallery, every control holding a valid value. A mixin of `Walk`, which
supplies the page, the values read from it and what the walk did.
"""

from __future__ import annotations

import re

__all__ = ["ALLOWED", "FORM", "NO_CLASS", "PANEL", "WalkChecks"]

# The validation messages the app means to give, as a toast that stays until closed: a request it refuses, in words.
ALLOWED = [
    r"work units for this model, over the budget",  # over the work budget (denoiser.app.work_budget)
    r"is not one of this model's classes",  # a class typed that the model lacks
    r"is not one of this generation's \d+ attention layers",  # a layer typed into the Attention tab
    r"heads must be 'all' or comma-separated numbers",  # the Heads tab's heads text
    r"generate images first",  # a view of a generation before there is one
    r"click a pixel of the image first",  # "average the maps over every step" before a pixel is chosen
    r"choose at least one attention layer to switch off",
    r"not a layer of .+, the model of the images shown",  # a layer listed by an earlier generation's statistics
    r"a Photo tab result has no seed to repeat",  # switching layers off after a Photo tab run
    r"no safetensors weights|is not valid JSON|does not load",  # the two broken model folders the fixture serves
    r"upload a photo first|upload an image first",
    r"inpaint needs a mask|the mask is empty",  # inpaint without painting
    r"the new photo is still loading into the editor",
    r"a guidance interval (is two timesteps|needs timesteps)",  # the guidance-interval text
    r"unknown PAG layer",  # the PAG-layers text
    r"perturbed-attention guidance needs",
    r"pixel [xy] must be a whole number",  # pixel numbers typed outside the image
    r"over the work budget",
    r"prompt weighting, at character",  # a weight in a prompt that does not read ("(red:x)")
    r"on a text model needs a prompt",  # classifier-free guidance without a prompt
    r"guidance needs a class",  # classifier-free guidance with the class at "(any)"
    r"swaps words one for one",  # a word edit of type replace with words added
    r"the edited prompt is the result's own|type the edited prompt",
    r"a word edit's layers cannot be switched off",
    r"(steps|seed|number of images) must be a whole number",  # a number typed out of range (denoiser.app.form_limits)
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
# a word edit's panel as its result's PNG names it (denoiser.app.word_edit.EDIT_SETTINGS): elem_id of each
PANEL = {"edit_prompt": "word-edit-prompt", "edit_type": "word-edit-type", "cross_replace_steps": "cross-replace",
         "self_replace_steps": "self-replace"}
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


class WalkChecks:
    """The checks of `Walk` (tests/app/walk.py): `check` runs them all and fails the walk with every problem found."""

    # ---- invariants -------------------------------------------------------------------------------------------

    def check(self) -> None:
        problems = self.check_log() + self.check_errors()
        values = self.values()
        problems += self.check_controls(values)
        problems += self.check_sample(values) + self.check_photo(values) + self.check_attention(values)
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
            number("cross-replace", 0, 1, whole=False)
            number("self-replace", 0, 1, whole=False)
            problems += self.check_class(v.get("model"), "class", v)
        if self.tab == "Photo":
            number("photo-cfg", 1, 10, whole=False)
            number("sigma", 0, 1, whole=False)
            number("strength", 0.01, 1, whole=False)
            problems += self.check_class(v.get("photo-model"), "photo-class", v)
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
        if self.expect_run:  # the press ran (its progress shown, then "done") or said why not
            seen = self.page.evaluate("() => window.walkStatusSeen || []")
            ran = any(t.startswith("denoising") for t in seen) and status.startswith("done")
            if not (ran or status.startswith("not started")):
                problems.append(f"{self.expect_run}: nothing ran; the status says {status[:120]!r} (and showed "
                                f"{list(dict.fromkeys(seen))[-3:]})")
            self.expect_run = ""
        done = re.match(r"done: (\d+) image\(s\)(?: of “.*”| of class (.+?))?, (\d+) steps", status, re.DOTALL)
        if done:
            n, drawn, steps = int(done[1]), done[2], int(done[3])
            made = self.settings(files[0]) if files else {}
            if len(files) != n or made.get("count") != n or made.get("steps") != steps or drawn != made.get("class"):
                problems.append(f"the status says {status!r}, the gallery shows {len(files)} image(s) made with "
                                f"{made.get('steps')} steps, class {made.get('class')!r}")
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
        if "edit_prompt" in self.reference:  # a word edit's result: its panel shows the edit it was made with
            for name, elem_id in PANEL.items():
                shown = v.get(elem_id)
                if name not in self.touched and shown is not None and not _same(shown, self.reference[name]):
                    problems.append(f"the word edit shows {name} = {shown!r}, the result it describes was made with "
                                    f"{self.reference[name]!r}")
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
        if text.startswith("Not shown:") and "is not one of this generation's" in text:  # a layer typed that is none
            return []
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

    def check_photo(self, v: dict) -> list[str]:
        """The Photo tab's status line against its gallery and the controls it ran with."""
        if self.tab != "Photo":
            return []
        files, status = self.files("photo-result"), self.page.locator("#photo-status").inner_text().strip()
        problems = []
        if files != self.photo_gallery and re.match(r"done: ", status):
            self.photo_touched = set()
        self.photo_gallery = files
        done = re.match(r"done: (.+?) with (\S+?),", status)
        if done:
            op, model = done.groups()
            if len(files) < 2:
                problems.append(f"the Photo status says {status!r}, its gallery shows {len(files)} picture(s)")
            if "model" not in self.photo_touched and v.get("photo-model") != model:
                problems.append(f"the Photo status says {status!r}, the Photo model shows {v.get('photo-model')!r}")
            if "operation" not in self.photo_touched and v.get("operation") != op:
                problems.append(f"the Photo status says {status!r}, the operation shows {v.get('operation')!r}")
        elif re.search(r"stopped at step|not started", status) and files != self.before_photo:
            problems.append(f"the Photo status says {status[:120]!r} (the results from the run before), but its gallery "
                            f"changed from {len(self.before_photo)} to {len(files)} picture(s)")
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

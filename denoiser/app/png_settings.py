"""A result's settings in its PNG (A1111's "PNG Info"): each result is named after how it was made and carries those
settings as JSON in a text chunk, and a PNG dropped back on the page fills the form of the tab that made it.

A Sample result's settings hold the sampler's (model, seed, scheduler, steps, class or prompt, guidance); a Photo result's
also its "operation" (denoise, edit, inpaint), which is how a PNG says which tab it belongs to (`tab_of`). A file
dropped on a tab is read by `dropped_settings`: not a picture, a picture of elsewhere, another tab's result, or the
settings to fill the form with, each said in one sentence.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

from PIL import Image, UnidentifiedImageError
from PIL.PngImagePlugin import PngInfo

from denoiser.atomic import atomic_path

__all__ = ["SETTINGS_KEY", "settings_name", "save_with_settings", "read_settings", "tab_of", "dropped_settings"]

SETTINGS_KEY = "denoiser"  # the PNG text chunk that holds how an image was made (JSON)
MAX_PROMPT_PART = 60  # a prompt's characters in a file name (the whole prompt is in the PNG's settings)


def settings_name(settings: dict) -> str:
    """A file name that says how an image was made: 'cifar10-seed3-cat-ddim25-cfg3-2of8.png' for a sample (a text
    model's: its prompt where the class goes, 'emoji-seed0-red_apple-unipc10-cfg3-1of8.png'; a word edit's pair:
    'emoji-seed0-red_apple-to-green_apple-unipc10-cfg3-2of2.png'),
    'cifar10-denoise-sigma0.1-seed0-1024x768.png' for an edit of a user's picture (settings with an "operation"; a
    copy scaled to the work budget: '...-scaled-from-4000x3000-1600x1200.png')."""
    if "operation" in settings:
        return _edit_name(settings)
    parts = [str(settings.get(k, "")) for k in ("model",)] + [f"seed{settings.get('seed')}"]
    if settings.get("class") not in (None, ""):
        parts.append(str(settings["class"]))
    if settings.get("prompt"):
        parts.append(_prompt_part(str(settings["prompt"])))
    if settings.get("edit_prompt"):  # a prompt-to-prompt pair: the source, then the edit ('red_apple-to-green_apple')
        parts[-1] += f"-to-{_prompt_part(str(settings['edit_prompt']))}"
    parts.append(f"{settings.get('scheduler')}{settings.get('steps')}")
    parts += _guidance_parts(settings)
    if "index" in settings:
        parts.append(f"{settings['index'] + 1}of{settings['count']}")
    return _file_name(parts)


def _prompt_part(prompt: str) -> str:
    """A prompt as a file name's part: its letters and digits with '_' for each space ('red apple' -> 'red_apple'),
    and where that loses something (emoji, punctuation, '_', a long prompt cut) a short hash of the whole prompt after
    it, so two prompts never share a name ('🍎❤️' -> 'h983700'; 'red_apple' -> 'red_apple-h22d643', where 'red apple'
    is 'red_apple')."""
    readable = _safe(prompt[:MAX_PROMPT_PART])
    if readable.replace("_", " ") == prompt:  # the name gives the prompt back: nothing to tell apart
        return readable
    digest = "h" + hashlib.sha1(prompt.encode("utf-8")).hexdigest()[:6]
    return f"{readable}-{digest}" if any(c.isalnum() for c in readable) else digest


def _edit_name(settings: dict) -> str:
    """An edit's file name: model, operation, class, its amounts (noise added first, σ removed, strength), the chain's
    steps and seed where it has one, guidance, the result's size."""
    parts = [str(settings.get("model", "")), re.sub(r"[^a-z0-9]+", "-", str(settings["operation"]).lower()).strip("-")]
    if settings.get("class") not in (None, ""):
        parts.append(str(settings["class"]))
    if settings.get("add_noise"):
        parts.append(f"noise{float(settings['add_noise']):.3g}")
    for key, short in (("sigma_removed", "sigma"), ("strength", "strength")):  # 0 is a value here (σ of a clean picture)
        if settings.get(key) is not None:
            parts.append(f"{short}{float(settings[key]):.3g}")
    if settings.get("chain"):  # sampled denoise, edit and inpaint: steps and seed make the result
        parts += [f"steps{settings.get('steps')}", f"seed{settings.get('seed')}"]
    parts += _guidance_parts(settings)
    if settings.get("scaled_from"):  # a photo over the work budget, restored as a smaller copy: both sizes named
        parts.append("scaled-from-" + "x".join(str(int(v)) for v in settings["scaled_from"]))
    if settings.get("size"):
        parts.append("x".join(str(int(v)) for v in settings["size"]))
    return _file_name(parts)


def _guidance_parts(settings: dict) -> list[str]:
    return [f"{short}{float(settings[key]):g}"
            for key, short, off in (("guidance_scale", "cfg", 1.0), ("pag_scale", "pag", 0.0), ("guide_scale", "auto", 1.0))
            if settings.get(key) is not None and float(settings[key]) != off]


def _safe(text: str) -> str:
    """`text` with every character but letters, digits and '._-' as '_' (a name every file system takes)."""
    return "".join(c if c.isalnum() or c in "._-" else "_" for c in text)


def _file_name(parts: list[str]) -> str:
    return "-".join(_safe(p) for p in parts) + ".png"


def save_with_settings(img: Image.Image, folder: str | Path, settings: dict) -> Path:
    """A PNG named after `settings` (settings_name) that carries them as JSON in its text chunk (read_settings)."""
    info = PngInfo()
    info.add_text(SETTINGS_KEY, json.dumps(settings, sort_keys=True))
    path = Path(folder) / settings_name(settings)
    with atomic_path(path) as tmp:
        img.save(tmp, format="PNG", pnginfo=info)
    return path


def read_settings(path: str | Path) -> dict:
    """The settings a PNG written by save_with_settings carries ({} for any other file)."""
    try:
        with Image.open(path) as img:
            return json.loads(img.text.get(SETTINGS_KEY, "{}"))
    except (OSError, ValueError, AttributeError):
        return {}


def tab_of(settings: dict) -> str:
    """The tab whose form a result's settings fill: "Photo" for a photo's result (its settings name an operation),
    else "Sample"."""
    return "Photo" if "operation" in settings else "Sample"


def dropped_settings(path: str | Path, tab: str, name: str | None = None) -> dict:
    """The settings a file dropped on `tab` ("Sample" or "Photo") fills that tab's form with. A ValueError says, in one
    sentence naming the file (`name`, as the person knows it, where `path` is a copy), why it fills nothing: it is no
    picture (a text file renamed .png), a picture this app did not make, or a result of the other tab."""
    name = name or Path(str(path)).name
    try:
        with Image.open(path) as img:
            kind = img.format
            img.verify()  # a cut or corrupted file fails here, before its settings are trusted
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError):
        raise ValueError(f"`{name}` is not a picture: it could not be read as a PNG (is it another kind of file, "
                         "renamed?); drop a PNG this app made") from None
    if kind != "PNG":
        raise ValueError(f"`{name}` is a {kind} picture, not a PNG: only a PNG this app made carries its settings")
    settings = read_settings(path)
    if not settings:
        raise ValueError(f"`{name}` carries no settings of this app: it is a picture (the Photo tab denoises and "
                         "edits it)")
    made_on = tab_of(settings)
    if made_on != tab:
        raise ValueError(f"`{name}` is a {made_on} tab result: its settings fill the {made_on} tab's form (drop it "
                         f"there); nothing here was changed")
    return settings

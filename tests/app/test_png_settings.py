"""denoiser/app/png_settings.py: a result's PNG named after and carrying its settings, and a dropped file read back."""

from __future__ import annotations

import pytest
from PIL import Image

from denoiser.app.png_settings import dropped_settings, read_settings, save_with_settings, settings_name, tab_of

SAMPLE = {"model": "cifar10", "seed": 3, "class": "cat", "scheduler": "ddim", "steps": 25, "guidance_scale": 3.0,
          "pag_scale": 0.0, "guide_scale": 1.0, "index": 1, "count": 8}
PHOTO = {"model": "cifar10", "operation": "denoise", "sigma": 0.0, "sigma_removed": 0.0812, "add_noise": 0.0,
         "chain": False, "seed": 0, "steps": 50, "guidance_scale": 1.0, "pag_scale": 0.0, "class": None,
         "size": [2400, 1800]}


def test_a_result_png_is_named_after_and_carries_its_settings(tmp_path):
    """Issue 35 item 14: downloads say how they were made, and the app reads the settings back."""
    path = save_with_settings(Image.new("RGB", (4, 4), "red"), tmp_path, SAMPLE)
    assert path.name == "cifar10-seed3-cat-ddim25-cfg3-2of8.png"
    assert read_settings(path) == SAMPLE and Image.open(path).getpixel((0, 0)) == (255, 0, 0)
    Image.new("RGB", (4, 4)).save(tmp_path / "plain.png")
    assert read_settings(tmp_path / "plain.png") == {}


def test_an_edit_result_is_named_after_its_operation_and_carries_its_settings(tmp_path):
    """Issue 41 item 12: an Edit result says how it was made, in its name and in its PNG (before: image.png, nothing)."""
    path = save_with_settings(Image.new("RGB", (4, 4), "red"), tmp_path, PHOTO)
    assert path.name == "cifar10-denoise-sigma0.0812-2400x1800.png" and read_settings(path) == PHOTO
    edit = {**PHOTO, "operation": "edit", "strength": 0.3, "sigma_removed": None, "chain": True, "seed": 7, "class": "cat",
            "guidance_scale": 2.0, "pag_scale": 0.5, "size": [32, 32]}
    assert settings_name(edit) == "cifar10-edit-cat-strength0.3-steps50-seed7-cfg2-pag0.5-32x32.png"
    sampled = {**PHOTO, "operation": "denoise (sampled)", "add_noise": 0.2, "chain": True, "size": [32, 32]}
    assert settings_name(sampled) == "cifar10-denoise-sampled-noise0.2-sigma0.0812-steps50-seed0-32x32.png"


def test_a_text_models_file_name_carries_its_prompt_where_a_class_would_go():
    settings = {"model": "emoji", "seed": 0, "prompt": "red apple", "scheduler": "unipc", "steps": 10,
                "guidance_scale": 3.0, "index": 0, "count": 8}
    assert settings_name(settings) == "emoji-seed0-red_apple-unipc10-cfg3-1of8.png"
    assert len(settings_name({**settings, "prompt": "x" * 500})) < 120  # a long prompt is cut
    edit = {**settings, "edit_prompt": "green apple", "index": 1, "count": 2}
    assert settings_name(edit) == "emoji-seed0-red_apple-to-green_apple-unipc10-cfg3-2of2.png"  # what it shows


@pytest.mark.parametrize("prompts", [("🍎❤️", "   ", "🍎❤", "  "), ("red apple: big!", "red apple: big?"),
                                     ("red_apple", "red apple"), ("x" * 70 + "a", "x" * 70 + "b"),
                                     ("(green:1.5) apple", "(green:2) apple")])
def test_prompts_that_differ_get_file_names_that_differ(prompts):
    """Issue 72 finding 8: "🍎❤️" and "   " were both named emoji-seed0-___-…png; a name that cannot show the prompt
    as typed carries a short hash of it, and still what it can show ('red_apple__big_-h…')."""
    names = [settings_name({"model": "emoji", "seed": 0, "prompt": p, "scheduler": "unipc", "steps": 10}) for p in prompts]
    assert len(set(names)) == len(names), names
    for prompt, name in zip(prompts, names):
        assert name.startswith("emoji-seed0-") and name.endswith("-unipc10.png") and "/" not in name
        if any(c.isalnum() for c in prompt):  # what can be read stays readable
            assert "".join(c for c in prompt[:10] if c.isalnum()) in "".join(c for c in name if c.isalnum())


def test_a_result_says_which_tab_it_belongs_to():
    assert tab_of(SAMPLE) == "Sample" and tab_of(PHOTO) == "Photo"


def test_a_dropped_file_fills_its_own_tabs_form_and_says_why_any_other_does_not(tmp_path):
    """Issue 72 findings 3 and 5: a Photo result dropped on the Sample tab, and a text file renamed .png, were both
    taken (one as settings "restored", one as "a picture"): each is refused in a sentence naming the file and why."""
    sample = save_with_settings(Image.new("RGB", (4, 4)), tmp_path, SAMPLE)
    photo = save_with_settings(Image.new("RGB", (4, 4)), tmp_path, PHOTO)
    assert dropped_settings(sample, "Sample") == SAMPLE and dropped_settings(photo, "Photo") == PHOTO
    with pytest.raises(ValueError, match=rf"`{photo.name}` is a Photo tab result: its settings fill the Photo tab"):
        dropped_settings(photo, "Sample")
    with pytest.raises(ValueError, match=rf"`{sample.name}` is a Sample tab result: its settings fill the Sample tab"):
        dropped_settings(sample, "Photo")
    text = tmp_path / "notes.png"
    text.write_text("shopping list: apples, pears\n")
    with pytest.raises(ValueError, match=r"`notes.png` is not a picture: it could not be read as a PNG"):
        dropped_settings(text, "Sample")
    cut = tmp_path / "cut.png"
    cut.write_bytes(sample.read_bytes()[:40])  # a PNG's header, then nothing
    with pytest.raises(ValueError, match="`cut.png` is not a picture"):
        dropped_settings(cut, "Sample")
    jpeg = tmp_path / "photo.png"
    Image.new("RGB", (4, 4)).save(jpeg, format="JPEG")
    with pytest.raises(ValueError, match="`photo.png` is a JPEG picture, not a PNG"):
        dropped_settings(jpeg, "Sample")
    plain = tmp_path / "holiday.png"
    Image.new("RGB", (4, 4)).save(plain)
    with pytest.raises(ValueError, match="`holiday.png` carries no settings of this app: it is a picture"):
        dropped_settings(plain, "Sample")

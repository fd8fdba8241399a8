"""Results kept in the browser (denoiser.app.earlier_results): what goes into localStorage comes back as the same PNGs with
their settings, newest first, at most KEEP; whatever else the browser sends back is left out."""

from __future__ import annotations

import base64
import io

from PIL import Image

from denoiser.app.earlier_results import KEEP, MAX_PNG_BYTES, recall, remember
from denoiser.app.engine import Engine
from denoiser.app.form import ModelForm
from denoiser.app.png_settings import read_settings, save_with_settings
from denoiser.app.sample_tab import SampleTab


def _results(folder, seed: int, n: int) -> list[tuple[str, None]]:
    """n result PNGs as the Sample tab's gallery hands them to a handler: (path, caption)."""
    settings = {"model": "m", "seed": seed, "scheduler": "ddim", "steps": 4, "num_images": n, "class": None,
                "guidance_scale": 1.0, "pag_scale": 0.0, "guide_scale": 1.0}
    return [(str(save_with_settings(Image.new("RGB", (8, 8), (20 * i, 90, 200)), folder / f"run{seed}",
                                    {**settings, "index": i, "count": n})), None) for i in range(n)]


def test_kept_results_come_back_with_their_settings_newest_first(tmp_path, monkeypatch):
    monkeypatch.setenv("GRADIO_TEMP_DIR", str(tmp_path / "gradio"))
    (tmp_path / "gradio").mkdir()
    first, second = _results(tmp_path, 1, 3), _results(tmp_path, 2, 2)
    kept = remember(second, remember(first, []))
    files = recall(kept)
    assert [read_settings(f)["seed"] for f in files] == [2, 2, 1, 1, 1]
    assert [f.rsplit("/", 1)[1] for f in files] == [p.rsplit("/", 1)[1] for p, _ in second + first]  # names kept
    assert all(f.startswith(str(tmp_path / "gradio")) for f in files)
    # "use these settings" reads a kept result as any other: its seed back in the form
    updates = ModelForm(Engine(tmp_path / "no-models")).use_settings(files, 3)  # model "m" is not served: no classes
    assert updates[3]["value"] == 1 and updates[-1] == f"settings of `{files[3].rsplit('/', 1)[1]}` restored: press Generate"
    many = remember(_results(tmp_path, 3, KEEP + 5), kept)
    assert len(many) == KEEP and len(recall(many)) == KEEP


def test_what_the_browser_sends_back_is_checked(tmp_path, monkeypatch):
    monkeypatch.setenv("GRADIO_TEMP_DIR", str(tmp_path))
    good = remember(_results(tmp_path, 1, 1), [])[0]
    jpeg = io.BytesIO()
    Image.new("RGB", (8, 8)).save(jpeg, "JPEG")
    big = base64.b64encode(b"\x89PNG" + bytes(MAX_PNG_BYTES)).decode()
    entries = [
        "not a dict", {"name": "x.png"}, {"name": "x.png", "png": "%%% not base64"},
        {"name": "photo.jpg", "png": base64.b64encode(jpeg.getvalue()).decode()},  # not a PNG
        {"name": "big.png", "png": big},
        {"name": "../../escape.png", "png": good["png"]},  # a path: only its name is used
        good,
    ]
    files = recall(entries)
    assert len(files) == 2 and all(f.startswith(str(tmp_path)) for f in files)
    assert files[0].endswith("/escape.png") and not (tmp_path.parent / "escape.png").exists()
    assert recall(None) == [] and remember([], None) == []


def test_earlier_results_leave_out_the_ones_just_shown(tmp_path, monkeypatch):
    """Issue 41 item 14: after a Generate the earlier-results gallery shows the results before it, not the new ones
    again under the gallery that already shows them (before: the new results twice, at once)."""
    monkeypatch.setenv("GRADIO_TEMP_DIR", str(tmp_path / "gradio"))
    (tmp_path / "gradio").mkdir()
    first, second = _results(tmp_path, 1, 3), _results(tmp_path, 2, 2)
    kept, earlier, button = SampleTab.keep_results(first, [])
    assert len(kept) == 3 and earlier["value"] == [] and not earlier["visible"] and not button["visible"]
    kept, earlier, button = SampleTab.keep_results(second, kept)
    assert len(kept) == 5 and [read_settings(f)["seed"] for f in earlier["value"]] == [1, 1, 1] and earlier["visible"]
    assert [read_settings(f)["seed"] for f in recall(kept)] == [2, 2, 1, 1, 1]  # a reload shows them all

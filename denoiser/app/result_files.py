"""A run's results as files: each image a PNG named after and carrying its settings, and all of them in one zip
named after the run (the Sample tab's gallery and "download all"; the word edit's results too).
"""

from __future__ import annotations

import os
import re
import tempfile
import zipfile
from pathlib import Path

import gradio as gr
import torch

from denoiser.app.png_settings import save_with_settings
from denoiser.image_io import to_pil

__all__ = ["result_files", "results_zip"]


def result_files(images: torch.Tensor, settings: dict) -> list[str]:
    """Each image as a PNG named after and carrying its settings (denoiser.app.png_settings.save_with_settings), in a folder
    of its own under the app's temp folder: downloads say how they were made, "use these settings" reads them back."""
    folder = tempfile.mkdtemp(prefix="results-", dir=os.environ.get("GRADIO_TEMP_DIR"))
    files = []
    for i in range(images.shape[0]):
        each = {**settings, "index": i, "count": images.shape[0]}
        path = save_with_settings(to_pil(images[i : i + 1], nrow=1, padding=0), folder, each)
        files.append(str(path))  # no caption over the picture: the file's name says it on download
    return files


def results_zip(gallery) -> dict:
    """The "download all" button's update: the gallery's results in one zip named after the run, the name its files
    share without their '-2of8' ('cifar10-seed3-cat-ddim25-cfg3.zip'; Gradio's own button names every zip
    gallery.zip). Hidden while the gallery is empty."""
    paths = [Path(item[0] if isinstance(item, (list, tuple)) else item) for item in gallery or []]
    if not paths:
        return gr.update(value=None, visible=False)
    stems = {re.sub(r"-\d+of\d+$", "", p.stem) for p in paths}
    name = stems.pop() if len(stems) == 1 else os.path.commonprefix(sorted(stems)).strip("-_") or "results"
    path = Path(tempfile.mkdtemp(prefix="zip-", dir=os.environ.get("GRADIO_TEMP_DIR"))) / f"{name}.zip"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as zf:  # PNGs are compressed already
        for p in paths:
            zf.write(p, p.name)
    return gr.update(value=str(path), label=f"download all {len(paths)} ({path.name})", visible=True)

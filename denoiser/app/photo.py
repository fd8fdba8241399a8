"""The Photo tab's photo: the upload kept beyond Gradio's cache sweep, the small copy the editor paints on, and the
(image, mask) a Photo tab run reads from the editor.

An upload is copied into a folder of the session's own at once (`keep_upload`): Gradio's cache sweep (layout's
`delete_cache`) removes the uploaded file after ~15 minutes, the copy lives as long as the session (a gr.State whose
delete_callback, `drop_upload`, removes it).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from PIL import Image

from denoiser.image_io import open_image
from denoiser.restore.plan import check_size

__all__ = ["NO_PHOTO", "keep_upload", "drop_upload", "photo_file", "editor_layers", "editor_picture", "photo_input", "centre_square", "photo_preview",
           "EDITOR_SIDE"]

# the editor paints on a copy of the photo at most this many pixels a side: the browser re-encodes what the editor
# holds as PNG on every run (a 2400x1800 JPEG of 600 KB became 8.4 MB), a copy this size stays ~1 MB. Denoise
# reads the photo itself, at its own size; the other operations work at the model's size (16-64 pixels).
EDITOR_SIDE = 512


def keep_upload(path: str) -> dict:
    """A copy of an uploaded file in a folder of its own, outside Gradio's swept cache: {"source": the upload,
    "copy": the copy}. The session's state holds it; drop_upload removes it."""
    folder = Path(tempfile.mkdtemp(prefix="upload-", dir=os.environ.get("GRADIO_TEMP_DIR")))
    copy = folder / ("photo" + Path(path).suffix.lower()[:8])
    shutil.copyfile(path, copy)
    return {"source": str(path), "copy": str(copy)}


def drop_upload(upload) -> None:
    """Remove a kept upload's copy (a session that ended, a photo replaced or cleared)."""
    if isinstance(upload, dict) and upload.get("copy"):
        shutil.rmtree(Path(upload["copy"]).parent, ignore_errors=True)


def photo_file(photo: str | None, upload) -> str | None:
    """The file to read the photo from: the session's copy of the upload the page shows, or the upload itself when
    its copy is not made yet (Run pressed as the upload arrives)."""
    if not photo:
        return None
    if isinstance(upload, dict) and upload.get("source") == photo and Path(upload["copy"]).is_file():
        return upload["copy"]
    if not Path(photo).is_file():
        raise ValueError("your upload has expired (kept while the page is in use, at most 30 minutes idle): "
                         "upload the photo again")
    return photo


NO_PHOTO = "upload a photo first (or click one of the pictures under “try a picture”, below the inpaint mask)"


def editor_layers(value) -> tuple[Image.Image | None, Image.Image | None]:
    """The ImageEditor's uploaded image and the painted mask (opaque brush pixels: white), or None."""
    if not value or value.get("background") is None:
        return None, None
    image = value["background"]
    if all(band == (255, 255) for band in image.convert("RGB").getextrema()):  # the editor's blank white canvas
        raise ValueError(NO_PHOTO)
    painted = [layer for layer in value.get("layers") or [] if layer is not None]
    if not painted:
        return image, None
    alpha = Image.new("L", painted[0].size, 0)
    for layer in painted:
        alpha = Image.composite(Image.new("L", layer.size, 255), alpha, layer.convert("RGBA").getchannel("A"))
    return image, alpha


def editor_picture(value) -> tuple[Image.Image, Image.Image | None]:
    """editor_layers of an editor that must hold a picture (an API call without an upload): NO_PHOTO if it holds none."""
    image, mask = editor_layers(value)
    if image is None:
        raise ValueError(NO_PHOTO)
    return image, mask


def photo_input(editor, source: str | None, photo: str | None, shown: str | None, operation: str, decode):
    """(image, mask) to process at the model's size: the uploaded photo as `decode` reads it (the rule every door
    decodes by, denoiser.restore.plan.read_photo) and the mask painted on its copy in the editor (stretched onto the
    photo: denoiser.image_io.mask_to_model); without an upload (an API call), the editor's own picture."""
    if not source:
        return editor_picture(editor)
    if shown != photo:  # the editor still holds the previous upload: its paint belongs to that one
        if operation == "inpaint":
            raise ValueError("the new photo is still loading into the editor: paint the area to regenerate on it, then Run")
        return decode(source), None
    return decode(source), editor_layers(editor)[1]


def centre_square(image: Image.Image) -> Image.Image:
    """The centre square of a picture: the part the model's size keeps (denoiser.image_io.image_to_model)."""
    side = min(image.size)
    left, top = (image.width - side) // 2, (image.height - side) // 2
    return image.crop((left, top, left + side, top + side))


def photo_preview(path: str | None) -> tuple[Image.Image | None, str]:
    """An uploaded photo file -> (an RGB copy at most EDITOR_SIDE pixels a side to paint on, a line saying so).
    Decoded with bounded memory (denoiser.image_io); a file that is no image raises a sentence without a path."""
    if path is None:
        return None, ""
    img = open_image(path, min_long_side=EDITOR_SIDE, what="the upload")  # a JPEG decodes at a reduced scale
    w, h = img.info["source_size"]
    check_size(w, h)  # refused at the upload, in words, not at Run
    img.thumbnail((EDITOR_SIDE, EDITOR_SIDE), Image.Resampling.LANCZOS)
    img.info["source_size"] = (w, h)
    return img, (f"your photo: {w}x{h}, shown at {img.width}x{img.height}. Denoise works on the photo at its own size; "
                 "the other operations on its centre square at the model's size. To inpaint, paint over what to regenerate.")

"""Results kept in the browser: the Sample tab's last KEEP results outlive the next Generate and a page reload.

Each finished Generate adds its PNGs (named after and carrying their settings: denoiser.app.png_settings.save_with_settings)
to a list held in the browser's localStorage (`gr.BrowserState`, encrypted with a key of this server run: a reload
brings them back, a restarted server starts with none, as Gradio allows). To be shown they are checked (PNG, size)
and written back to files, which "use these settings" reads as it reads any result.
"""

from __future__ import annotations

import base64
import binascii
import io
import os
import tempfile
from pathlib import Path

from PIL import Image

__all__ = ["KEEP", "STORAGE_KEY", "remember", "recall"]

KEEP = 48  # results kept per browser, newest first (a 32x32 PNG is ~3 KB: well inside localStorage's ~5 MB)
MAX_PNG_BYTES = 256 * 1024  # one kept result at most; the models' images are far smaller
STORAGE_KEY = "denoiser-kept-results"  # the same localStorage entry across reloads


def remember(files, kept: list | None) -> list[dict]:
    """`kept` with the gallery's new result files in front (as {"name", "png": base64}), at most KEEP."""
    new = []
    for item in files or []:
        path = Path(item[0] if isinstance(item, (list, tuple)) else item)  # gallery items: (path, caption) or path
        data = path.read_bytes()
        if len(data) <= MAX_PNG_BYTES:
            new.append({"name": path.name, "png": base64.b64encode(data).decode("ascii")})
    return (new + [k for k in (kept or []) if isinstance(k, dict)])[:KEEP]


def recall(kept: list | None) -> list[str]:
    """The kept results as files (in a new folder under the app's temp folder), in order; entries that are not
    small PNGs are left out (what the browser sends back is never trusted)."""
    folder = Path(tempfile.mkdtemp(prefix="kept-", dir=os.environ.get("GRADIO_TEMP_DIR")))
    files = []
    for i, item in enumerate((kept or [])[:KEEP]):
        png = _checked_png(item)
        if png is None:
            continue
        name = "".join(c if c.isalnum() or c in "._-" else "_" for c in Path(str(item["name"])).name)[:120]
        path = folder / f"{i:02d}" / (name if name.endswith(".png") else name + ".png")  # names may repeat
        path.parent.mkdir()
        path.write_bytes(png)
        files.append(str(path))
    return files


def _checked_png(item) -> bytes | None:
    """The PNG bytes of a kept entry, or None when it is not a small, valid PNG."""
    try:
        data = base64.b64decode(item["png"], validate=True)
        if len(data) > MAX_PNG_BYTES:
            return None
        with Image.open(io.BytesIO(data)) as img:
            ok = img.format == "PNG"
            img.verify()
        return data if ok else None
    except (KeyError, TypeError, ValueError, binascii.Error, OSError, Image.DecompressionBombError):
        return None

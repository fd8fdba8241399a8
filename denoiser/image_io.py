"""Images in and out: a user's files read with bounded memory whatever the file claims, turned upright, and
mapped onto the model's grid (the image and its mask alike); tensors back to pictures, grids and PNGs.

What phones and cameras write (JPEG, PNG, WebP, and HEIF where Pillow reads it) is accepted up to
`MAX_PIXELS`; the size comes from the header before anything is decoded, and a JPEG decodes at the
smallest of 1/1, 1/2, 1/4, 1/8 scale that still covers the size asked for (Pillow's `draft`), so a
50-megapixel photo costs a few MB, not 150. Every refusal is one sentence without a file path.
"""

from __future__ import annotations

import io
import math
import warnings
from pathlib import Path
from typing import BinaryIO

import numpy as np
import torch
from PIL import Image, ImageOps, UnidentifiedImageError
from torchvision import transforms
from torchvision.transforms import functional as TF
from torchvision.utils import make_grid

from denoiser.atomic import atomic_path
from denoiser.pixels import to_model_range, to_uint8, uint8_to_unit

__all__ = ["MAX_PIXELS", "flatten_to_rgb", "fit_to_size", "open_image", "image_to_model", "mask_to_model", "to_pil", "uint8_to_pil", "save_grid",
           "save_png"]

MAX_PIXELS = 50_000_000  # a 50-megapixel camera's photo; more is refused before decoding


def flatten_to_rgb(img: Image.Image) -> Image.Image:
    """Any mode -> RGB; transparent pixels (RGBA, LA, palette with transparency) lie on white.

    A plain `convert("RGB")` would keep whatever colour hides under alpha = 0 (often black or noise),
    so emoji and icons would sit on garbage backgrounds. 16-bit greyscale keeps its top 8 bits (PIL's
    own conversion would clip everything above 255 to white).
    """
    if img.mode in ("I;16", "I;16L", "I;16B", "I"):
        img = Image.fromarray((np.asarray(img, dtype=np.int64) >> 8).clip(0, 255).astype(np.uint8), "L")
    if img.mode in ("RGBA", "LA", "PA") or (img.mode == "P" and "transparency" in img.info):
        rgba = img.convert("RGBA")
        white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(white, rgba).convert("RGB")
    return img.convert("RGB")  # grayscale, palette, CMYK ... become RGB


def fit_to_size(size: int) -> transforms.Compose:
    """PIL image -> PIL image: the short side resized to `size` (bicubic, antialiased), then centre-cropped."""
    return transforms.Compose([
        transforms.Resize(size, interpolation=transforms.InterpolationMode.BICUBIC, antialias=True),
        transforms.CenterCrop(size),
    ])


def open_image(
    source: str | Path | bytes | BinaryIO, min_side: int | None = None, what: str = "the file",
    min_long_side: int | None = None, keep_pixels: float | None = None,
) -> Image.Image:
    """Read an image file: its size checked from the header, JPEGs decoded only as large as `min_side`
    needs (the short side stays >= min_side; or the long side >= min_long_side; or, for an image of more than
    `keep_pixels` pixels, at least that many pixels stay), EXIF orientation applied, transparency flattened on white.
    The file's own (upright) size is in `.info["source_size"]`.

    Raises ValueError (one sentence naming the problem and the fix, no path) for anything that is not a
    readable image of at most MAX_PIXELS pixels; FileNotFoundError for a missing path.
    """
    if isinstance(source, bytes):
        source = io.BytesIO(source)
    if _is_empty(source):
        raise ValueError(f"{what} is empty (0 bytes): choose the file again, or another one")
    try:
        with warnings.catch_warnings():  # Pillow warns of decompression bombs; the pixel cap below refuses them
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            img = Image.open(source)
    except FileNotFoundError:
        raise FileNotFoundError(f"{what} does not exist") from None
    except Image.DecompressionBombError:  # Pillow's own refusal, past twice its pixel limit (~179 megapixels)
        raise ValueError(
            f"the image is far larger than {MAX_PIXELS // 1_000_000} megapixels: at most {MAX_PIXELS // 1_000_000} "
            "megapixels; upload a smaller copy"
        ) from None
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError):
        raise ValueError(f"{what} is not an image denoiser can read: use a PNG, JPEG or WebP file") from None
    with img:
        w, h = img.size
        if w * h > MAX_PIXELS:
            raise ValueError(
                f"the image is {w}x{h} ({w * h / 1e6:.0f} megapixels): at most {MAX_PIXELS // 1_000_000} megapixels; "
                "upload a smaller copy"
            )
        if keep_pixels and w * h > keep_pixels:  # the long side of a copy of keep_pixels pixels
            min_long_side = math.ceil(max(w, h) * (keep_pixels / (w * h)) ** 0.5)
        if (min_side or min_long_side) and img.format == "JPEG":
            # decode at 1/2, 1/4, 1/8 while the short side keeps min_side (the long side min_long_side)
            scale = min(w, h) / min_side if min_side else max(w, h) / min_long_side
            img.draft("RGB", (max(1, int(w / scale)), max(1, int(h / scale))))
        try:
            img.load()
            upright = ImageOps.exif_transpose(img)  # phone photos are stored sideways with an EXIF rotation
        except (OSError, SyntaxError, ValueError, Image.DecompressionBombError):
            raise ValueError(f"{what} is damaged or truncated and cannot be decoded: upload it again or another file") from None
        rgb = flatten_to_rgb(upright)
        rgb.info["source_size"] = (w, h) if (rgb.width >= rgb.height) == (w >= h) else (h, w)
        return rgb


def _is_empty(source) -> bool:
    """Whether a path or a seekable file holds 0 bytes (a missing path is left to the opening, which says so)."""
    if isinstance(source, (str, Path)):
        return Path(source).is_file() and Path(source).stat().st_size == 0
    if hasattr(source, "seek") and hasattr(source, "tell"):
        here = source.tell()
        empty = source.seek(0, io.SEEK_END) == here == 0
        source.seek(here)
        return empty
    return False


def image_to_model(image: Image.Image, size: int) -> torch.Tensor:
    """A user's image (any size or mode; transparency on white) -> (1, 3, size, size) in [-1, 1]: the short
    side resized to `size`, then centre-cropped."""
    return to_model_range(TF.pil_to_tensor(fit_to_size(size)(flatten_to_rgb(image)))[None])  # (1, 3, S, S)


def mask_to_model(mask: Image.Image, image_size: tuple[int, int], size: int) -> torch.Tensor:
    """A mask (white = regenerate) of any size -> (1, 1, size, size) in {0, 1}, lying where it was painted:
    first stretched onto the image's (width, height), then reduced and cropped exactly as `image_to_model`
    reduces and crops the image (nearest-neighbour, so the mask stays a mask)."""
    w, h = image_size
    grey = mask.convert("L").resize((w, h), Image.Resampling.NEAREST)
    # torchvision's Resize(size): the short side becomes `size`, the long one int(size * long / short)
    new = (size, int(size * h / w)) if w <= h else (int(size * w / h), size)
    cropped = TF.center_crop(grey.resize(new, Image.Resampling.NEAREST), [size, size])  # fit_to_size's crop
    return (uint8_to_unit(TF.pil_to_tensor(cropped)[None]) > 0.5).float()  # (1, 1, S, S)


def to_pil(images: torch.Tensor, nrow: int | None = None, padding: int = 2) -> Image.Image:
    """(B, C, H, W) in [0, 1] -> one PIL image: the grid (nrow per row, default ~square)."""
    if nrow is None:
        nrow = max(1, int(round(images.shape[0] ** 0.5)))
    grid = make_grid(images, nrow=nrow, padding=padding, pad_value=1.0)  # (C, H', W')
    return uint8_to_pil(to_uint8(grid))


def uint8_to_pil(image: torch.Tensor) -> Image.Image:
    """(C, H, W) uint8 -> PIL."""
    return Image.fromarray(image.permute(1, 2, 0).numpy())  # (C, H, W) -> (H, W, C)


def save_grid(images: torch.Tensor, path: str | Path, nrow: int | None = None, scale: int = 1) -> Path:
    """Write a PNG grid, optionally upscaled by `scale` (nearest, so pixels stay sharp)."""
    img = to_pil(images, nrow)
    if scale > 1:
        img = img.resize((img.width * scale, img.height * scale), Image.Resampling.NEAREST)
    return save_png(img, path)


def save_png(img: Image.Image, path: str | Path) -> Path:
    """Save a PNG through a temporary file and a rename, so a reader never sees half a file."""
    path = Path(path)
    if path.suffix.lower() != ".png":
        raise ValueError(f"output must be a .png file, got {str(path)!r}")
    with atomic_path(path) as tmp:
        img.save(tmp, format="PNG")
    return path

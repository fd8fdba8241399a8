"""One image file (or its bytes) -> RGB pixels at the model's `sample_size`, as (3, S, S) uint8.

The short side is resized to S (bicubic, antialiased) and the centre cropped, after the EXIF orientation
is applied (phones store rotated pixels and a tag). JPEGs are decoded at the smallest DCT scale (1/2, 1/4,
1/8) that still covers S on both sides: a 12-megapixel photo decodes about 10x faster at 1/8 and the
bicubic downscale that follows hides the difference.
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
from PIL import Image, ImageOps
from torchvision import transforms

__all__ = ["flatten_to_rgb", "fit_to_size", "decode_image", "is_image_name"]


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


def decode_image(source: str | Path | bytes, size: int) -> np.ndarray:
    """A file path or encoded bytes -> (3, size, size) uint8. Raises on anything unreadable (the caller skips it)."""
    with Image.open(io.BytesIO(source) if isinstance(source, bytes) else source) as img:
        img.draft("RGB", (size, size))  # JPEG only: the largest DCT reduction with both sides still >= size
        img.load()  # decode now: a truncated file fails here, inside the caller's try
        rgb = flatten_to_rgb(ImageOps.exif_transpose(img))
    return np.asarray(fit_to_size(size)(rgb)).transpose(2, 0, 1)  # (S, S, 3) -> (3, S, S)


def is_image_name(name: str) -> bool:
    """Whether PIL knows the file extension (.jpg, .png, .webp, .tif, ...)."""
    return Path(name).suffix.lower() in Image.registered_extensions()

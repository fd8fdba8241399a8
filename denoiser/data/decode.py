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

from denoiser.image_io import fit_to_size, flatten_to_rgb

__all__ = ["decode_image", "is_image_name"]


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

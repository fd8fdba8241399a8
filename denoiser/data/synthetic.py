"""The built-in set (`data.dataset: synthetic`): coloured shapes (circle, square, triangle, cross) labelled by
shape, deterministic by seed, made on the fly (nothing to download or point at)."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

import numpy as np
import torch
from PIL import Image, ImageDraw

from denoiser.data.base import Chunk, Source
from denoiser.data.images import ImageDataset

__all__ = ["SHAPES", "SyntheticSource", "make_synthetic", "synthetic_images"]

SHAPES = ("circle", "square", "triangle", "cross")


def _colour(rng: random.Random, avoid: tuple[int, int, int] | None = None) -> tuple[int, int, int]:
    while True:
        c = tuple(rng.choice((0, 40, 90, 150, 210, 255)) for _ in range(3))
        if avoid is None or sum(abs(a - b) for a, b in zip(c, avoid)) > 250:
            return c


def _synthetic_image(index: int, size: int, seed: int) -> tuple[Image.Image, int]:
    """One deterministic image: a coloured shape (the label) on a plain or softly graded background."""
    rng = random.Random(seed * 1_000_003 + index)
    label = rng.randrange(len(SHAPES))
    s = 4 * size  # draw large, then downsample: anti-aliased edges that stay crisp at `size`
    bg = _colour(rng)
    img = Image.new("RGB", (s, s), bg)
    draw = ImageDraw.Draw(img)
    if rng.random() < 0.5:  # light texture: a vertical gradient towards a second colour
        bg2 = tuple(min(255, max(0, c + rng.randint(-40, 40))) for c in bg)
        for y in range(s):
            a = y / (s - 1)
            draw.line([(0, y), (s, y)], fill=tuple(round((1 - a) * c1 + a * c2) for c1, c2 in zip(bg, bg2)))
    fg = _colour(rng, avoid=bg)
    r = rng.uniform(0.22, 0.38) * s
    cx, cy = rng.uniform(r, s - r), rng.uniform(r, s - r)
    shape = SHAPES[label]
    if shape == "circle":
        draw.ellipse([cx - r, cy - r, cx + r, cy + r], fill=fg)
    elif shape == "square":
        draw.rectangle([cx - r * 0.85, cy - r * 0.85, cx + r * 0.85, cy + r * 0.85], fill=fg)
    elif shape == "triangle":
        pts = [(cx + r * math.cos(a), cy + r * math.sin(a)) for a in (-math.pi / 2, math.pi / 6, 5 * math.pi / 6)]
        draw.polygon(pts, fill=fg)
    else:
        w = r * 0.35
        draw.rectangle([cx - r, cy - w, cx + r, cy + w], fill=fg)
        draw.rectangle([cx - w, cy - r, cx + w, cy + r], fill=fg)
    return img.resize((size, size), Image.Resampling.BOX), label


def synthetic_images(start: int, stop: int, size: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Images start..stop-1 of the set: (n, 3, size, size) uint8 and their labels (n,)."""
    pixels = np.empty((stop - start, 3, size, size), dtype=np.uint8)
    labels = np.empty(stop - start, dtype=np.int64)
    for i in range(start, stop):
        img, labels[i - start] = _synthetic_image(i, size, seed)
        pixels[i - start] = np.asarray(img).transpose(2, 0, 1)  # (S, S, 3) -> (3, S, S)
    return pixels, labels


def make_synthetic(num_images: int, size: int, seed: int = 0) -> ImageDataset:
    """`num_images` coloured shapes in memory, labelled by shape, deterministic by `seed`."""
    if num_images < 1:
        raise ValueError(f"data.num_images must be at least 1, got {num_images}")
    pixels, labels = synthetic_images(0, num_images, size, seed)
    return ImageDataset(torch.from_numpy(pixels), torch.from_numpy(labels), list(SHAPES))


@dataclass
class SyntheticSource(Source):
    num_images: int
    seed: int
    name: str = "synthetic"

    def __post_init__(self):
        if self.num_images < 1:
            raise ValueError(f"data.num_images must be at least 1, got {self.num_images}")
        self.classes = list(SHAPES)

    def __len__(self) -> int:
        return self.num_images

    def fingerprint(self) -> str:
        return f"synthetic-{self.num_images}-{self.seed}"

    def read(self, start: int, stop: int, size: int) -> Chunk:
        return Chunk(*synthetic_images(start, stop, size, self.seed))

"""Datasets: the built-in synthetic shapes, an image folder (ImageFolder layout) and CIFAR-10.

Every dataset is decoded once, resized and centre-cropped to the model's `sample_size`, and kept in
memory as uint8 (50,000 CIFAR-10 images are 150 MB); batches come out as float tensors in [-1, 1].
Random horizontal flips are applied per batch by the training loop with its own seeded generator,
so a resumed run sees exactly the same images. The validation split is a seeded permutation.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from pathlib import Path

import torch
from PIL import Image, ImageDraw, UnidentifiedImageError
from torchvision import datasets, transforms
from torchvision.transforms import functional as TF

from denoiser.config import DataConfig

__all__ = ["ImageDataset", "make_synthetic", "load_folder", "flatten_to_rgb", "load_cifar10", "load_datasets", "to_model_range"]

SHAPES = ("circle", "square", "triangle", "cross")


@dataclass
class ImageDataset:
    """Images (N, C, H, W) uint8 with labels (N,) and class names."""

    images: torch.Tensor
    labels: torch.Tensor
    classes: list[str]

    def __len__(self) -> int:
        return self.images.shape[0]

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        return to_model_range(self.images[i]), int(self.labels[i])

    def subset(self, indices: torch.Tensor) -> ImageDataset:
        return ImageDataset(self.images[indices], self.labels[indices], self.classes)

    def batch(self, indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """indices (B,) -> images (B, C, H, W) float in [-1, 1], labels (B,)."""
        return to_model_range(self.images[indices]), self.labels[indices]


def to_model_range(images: torch.Tensor) -> torch.Tensor:
    """uint8 [0, 255] -> float [-1, 1]."""
    return images.float().div(127.5).sub(1.0)


# --------------------------------------------------------------------------------------------
# Synthetic shapes
# --------------------------------------------------------------------------------------------


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


def make_synthetic(num_images: int, size: int, seed: int = 0) -> ImageDataset:
    """The built-in set: `num_images` coloured shapes, labelled by shape, deterministic by `seed`."""
    if num_images < 1:
        raise ValueError(f"data.num_images must be at least 1, got {num_images}")
    images = torch.empty(num_images, 3, size, size, dtype=torch.uint8)
    labels = torch.empty(num_images, dtype=torch.long)
    for i in range(num_images):
        img, labels[i] = _synthetic_image(i, size, seed)
        images[i] = TF.pil_to_tensor(img)
    return ImageDataset(images, labels, list(SHAPES))


# --------------------------------------------------------------------------------------------
# Image folders and CIFAR-10
# --------------------------------------------------------------------------------------------


def _load_rgb(path: str) -> Image.Image:
    try:
        with Image.open(path) as img:
            return flatten_to_rgb(img)
    except (UnidentifiedImageError, OSError, SyntaxError) as err:
        raise ValueError(f"cannot read image {path}: {err}; remove or replace the file") from None


def flatten_to_rgb(img: Image.Image) -> Image.Image:
    """Any mode -> RGB; transparent pixels (RGBA, LA, palette with transparency) lie on white.

    A plain `convert("RGB")` would keep whatever colour hides under alpha = 0 (often black or noise),
    so emoji and icons would sit on garbage backgrounds.
    """
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


def _resize_crop(size: int) -> transforms.Compose:
    return transforms.Compose([fit_to_size(size), transforms.PILToTensor()])


def load_folder(path: str | Path, size: int) -> ImageDataset:
    """An ImageFolder tree (`root/<class>/<image>`), resized and centre-cropped to `size`."""
    root = Path(path)
    if not root.is_dir():
        raise FileNotFoundError(f"data folder {str(root)!r} does not exist; set data.path to an image folder")
    try:
        folder = datasets.ImageFolder(str(root), loader=_load_rgb, transform=_resize_crop(size))
    except FileNotFoundError as err:
        raise ValueError(
            f"no images found in {str(root)!r} ({err}); expected class sub-folders with .jpg/.png files, "
            "e.g. root/cat/001.png"
        ) from None
    images = torch.empty(len(folder), 3, size, size, dtype=torch.uint8)
    for i in range(len(folder)):
        images[i] = folder[i][0]
    labels = torch.tensor(folder.targets, dtype=torch.long)
    return ImageDataset(images, labels, list(folder.classes))


def load_cifar10(path: str | Path, size: int) -> ImageDataset:
    """CIFAR-10 in its python format (`cifar-10-batches-py` under `path`); never downloads."""
    try:
        ds = datasets.CIFAR10(str(path), train=True, download=False)
    except RuntimeError as err:
        raise FileNotFoundError(
            f"no CIFAR-10 python files under {str(path)!r} ({err}); put cifar-10-batches-py there, "
            "or use dataset: folder for an image folder"
        ) from None
    images = torch.from_numpy(ds.data).permute(0, 3, 1, 2).contiguous()  # (N, 32, 32, 3) -> (N, 3, 32, 32)
    if size != images.shape[-1]:
        images = TF.resize(images, [size, size], antialias=True)
    return ImageDataset(images, torch.tensor(ds.targets, dtype=torch.long), list(ds.classes))


def split(ds: ImageDataset, val_size: int, seed: int) -> tuple[ImageDataset, ImageDataset]:
    """A deterministic train/validation split: the first `val_size` of a seeded permutation."""
    if val_size >= len(ds):
        raise ValueError(f"data.val_size={val_size} leaves no training images (the set has {len(ds)}); lower it")
    perm = torch.randperm(len(ds), generator=torch.Generator().manual_seed(seed))
    val, train = perm[:val_size].sort().values, perm[val_size:].sort().values
    return ds.subset(train), ds.subset(val)


def load_dataset(cfg: DataConfig, sample_size: int) -> ImageDataset:
    if cfg.dataset == "synthetic":
        return make_synthetic(cfg.num_images, sample_size, cfg.synthetic_seed)
    if cfg.dataset == "folder":
        return load_folder(cfg.path, sample_size)
    if cfg.dataset == "cifar10":
        return load_cifar10(cfg.path, sample_size)
    raise ValueError(f"unknown dataset {cfg.dataset!r}; use synthetic, folder or cifar10")


def load_datasets(cfg: DataConfig, sample_size: int) -> tuple[ImageDataset, ImageDataset]:
    """(train, validation) for a data config at the model's `sample_size`."""
    return split(load_dataset(cfg, sample_size), cfg.val_size, cfg.val_seed)

"""A set of uint8 images with labels, in memory or memory-mapped from a prepared store, and its split; one
step's images for one process (`StepBatch`).

Batches come out as float tensors in [-1, 1]. Random horizontal flips are applied per batch by the training
loop with its own seeded generator, so a resumed run sees exactly the same images. The validation split is
a seeded permutation; it is small and copied into memory, the training split stays a view of the store.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from denoiser.data.captions import CaptionTable
from denoiser.pixels import to_model_range

__all__ = ["ImageDataset", "MappedImages", "StepBatch", "split"]


class MappedImages:
    """(N, C, H, W) uint8 images that live in memory-mapped Arrow record batches (a store's `data.arrow`).

    Indexing with a tensor of indices copies only those images; nothing else is ever read into this
    process's own memory (the pages belong to the OS page cache, shared by every process on the machine).
    """

    def __init__(self, chunks: list[np.ndarray], rows: torch.Tensor | None = None):
        with warnings.catch_warnings():  # the store is read-only; we never write through these tensors
            warnings.simplefilter("ignore", UserWarning)
            self.chunks = [torch.from_numpy(c) for c in chunks]  # each (n_i, C, H, W), zero-copy
        sizes = torch.tensor([len(c) for c in self.chunks])
        self.starts = torch.cumsum(sizes, 0) - sizes  # first row of each chunk
        self.total = int(sizes.sum())
        self.rows = rows  # this view's rows of the whole store; None = all of them

    @property
    def shape(self) -> torch.Size:
        return torch.Size((len(self), *self.chunks[0].shape[1:]))

    dtype = torch.uint8

    def __len__(self) -> int:
        return self.total if self.rows is None else len(self.rows)

    def __getitem__(self, index) -> torch.Tensor:
        if isinstance(index, slice):
            index = torch.arange(len(self))[index]
        idx = torch.as_tensor(index, dtype=torch.long)
        single = idx.ndim == 0
        idx = idx.reshape(-1)
        if self.rows is not None:
            idx = self.rows[idx]
        chunk = torch.searchsorted(self.starts, idx, right=True) - 1
        out = torch.empty((len(idx), *self.chunks[0].shape[1:]), dtype=torch.uint8)
        for c in chunk.unique().tolist():
            hit = chunk == c
            out[hit] = self.chunks[c][idx[hit] - self.starts[c]]
        return out[0] if single else out

    def take(self, rows: torch.Tensor) -> MappedImages:
        """A view of some rows (no copy)."""
        view = MappedImages.__new__(MappedImages)
        view.chunks, view.starts, view.total = self.chunks, self.starts, self.total
        view.rows = rows if self.rows is None else self.rows[rows]
        return view


@dataclass
class ImageDataset:
    """Images (N, C, H, W) uint8 with labels (N,) and class names; `store` is the folder they are mapped from;
    `candidates`, each image's candidate captions (denoiser/data/captions.py), when the data carries text."""

    images: torch.Tensor | MappedImages
    labels: torch.Tensor
    classes: list[str]
    store: Path | None = None
    candidates: CaptionTable | None = None

    def __len__(self) -> int:
        return self.images.shape[0]

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        return to_model_range(self.images[i]), int(self.labels[i])

    def subset(self, indices: torch.Tensor) -> ImageDataset:
        """Some rows: a view of a memory-mapped set, a copy of an in-memory one."""
        images = self.images.take(indices) if isinstance(self.images, MappedImages) else self.images[indices]
        candidates = None if self.candidates is None else self.candidates.take(indices)
        return ImageDataset(images, self.labels[indices], self.classes, self.store, candidates)

    def in_memory(self) -> ImageDataset:
        """The same set with its pixels copied into a tensor (for small sets: validation, FID references)."""
        if isinstance(self.images, MappedImages):
            return ImageDataset(self.images[torch.arange(len(self))], self.labels, self.classes, self.store, self.candidates)
        return self

    def batch(self, indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """indices (B,) -> images (B, C, H, W) float in [-1, 1], labels (B,)."""
        return to_model_range(self.images[indices]), self.labels[indices]


@dataclass
class StepBatch:
    """This process's images of one optimizer step, in [accumulation step][image] order, from the store or a stream.

    The training loop draws each image's noise, timestep, flip and label drop: for `draw_size` images from a
    generator keyed by `draw_key`, of which this process's images take positions `draw_rows`. Captions are picked
    (and dropped) here already, each by (seed, step, image id) alone (denoiser/data/captions.py). With the store the
    draws cover the step's whole global batch (key: the step), so any split over processes and accumulation
    steps slices the same numbers; a stream's ranks draw for their own images only (key: step, rank).
    """

    ids: torch.Tensor  # (n,) store rows, or a stream's global item numbers
    pixels: torch.Tensor  # (n, 3, S, S) uint8
    labels: torch.Tensor  # (n,) int64 class indices
    draw_key: tuple[int, ...]
    draw_size: int
    draw_rows: torch.Tensor  # (n,) positions among the draw_size draws
    captions: list[str] | None = None  # one per image, picked for this step ("" = dropped, no condition); None: the data has no text
    skipped: list[tuple[str, str]] = field(default_factory=list)  # items that could not be decoded (item, why)


def split(ds: ImageDataset, val_size: int, seed: int) -> tuple[ImageDataset, ImageDataset]:
    """A deterministic train/validation split: the first `val_size` of a seeded permutation.
    The validation images are copied into memory; the training split stays a view."""
    if val_size >= len(ds):
        raise ValueError(f"data.val_size={val_size} leaves no training images (the set has {len(ds)}); lower it")
    perm = torch.randperm(len(ds), generator=torch.Generator().manual_seed(seed))
    val, train = perm[:val_size].sort().values, perm[val_size:].sort().values
    return ds.subset(train), ds.subset(val).in_memory()

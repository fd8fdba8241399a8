"""What every source of training images is, and the helpers the sources share.

A `Source` is what a store is prepared from: it lists its items up front (cheap: names and sizes, no pixels),
has a fingerprint that changes whenever its content would, and reads any range of items as pixels at a given
size. A sharded source (WebDataset tars, a Hugging Face dataset's files) can also be opened as `Shards`, which a
stream reads item by item (denoiser/data/stream.py). Unreadable items are skipped and reported with the reason,
never fatal on their own.

The table of sources, one row per `data.dataset` name, is denoiser/data/sources.py.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from denoiser.data.captions import Candidates, CaptionSpec

__all__ = ["Chunk", "Source", "Shards", "gather", "labels_from", "slug", "content_key"]


@dataclass
class Chunk:
    """Some items read: the usable ones' pixels (n, 3, S, S) uint8, labels (n,) and candidate captions, and the
    skipped ones."""

    pixels: np.ndarray
    labels: np.ndarray
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (item, why)
    candidates: list[Candidates] | None = None  # (n,) each image's caption groups; None: the source asks for no text


class Source:
    """Base of the sources: `name`, `classes`, `len()`, `fingerprint()` and `read(start, stop, size)`."""

    name = "source"
    classes: list[str]  # class names; empty for an unconditional set
    parallel = True  # worth decoding in worker processes
    caption_spec: CaptionSpec | None = None  # the text asked for (data.caption_columns); None: no captions

    def __len__(self) -> int:
        raise NotImplementedError

    def fingerprint(self) -> str:
        raise NotImplementedError

    def read(self, start: int, stop: int, size: int) -> Chunk:
        raise NotImplementedError


class Shards:
    """Items of a sharded source, found without decoding: shard s holds `sizes[s]` items, item i labelled
    `labels[s][i]` with caption groups `candidates[s][i]` (small: read when indexing, like the labels);
    `encoded(s, i)` reads one item's image (bytes or a file path) for `decode_image`."""

    where: str  # data.path, for messages
    classes: list[str]  # class names; empty for an unconditional set
    sizes: list[int]
    labels: list[np.ndarray]  # per shard, (sizes[s],) int64
    candidates: list[list[Candidates]] | None = None  # per shard, each item's caption groups; None: no text asked for
    dropped: list[tuple[str, str]]  # items left out when indexing (item, why)

    def encoded(self, shard: int, item: int) -> bytes | str:
        raise NotImplementedError

    def item_name(self, shard: int, item: int) -> str:
        raise NotImplementedError


def gather(items: list[tuple[str, int]], size: int, decode: Callable[[str], np.ndarray],
           candidates: list[Candidates] | None = None) -> Chunk:
    """Decode (item, label) pairs with `decode(item) -> (3, S, S) uint8`, skipping the failures; `candidates`, one per
    item, travel with the items kept."""
    pixels, labels, kept, skipped = [], [], [], []
    for j, (item, label) in enumerate(items):
        try:
            pixels.append(decode(item))
            labels.append(label)
            kept.append(j)
        except Exception as err:  # noqa: BLE001 - any failure of one item skips that item, with its reason
            skipped.append((item, f"{type(err).__name__}: {err}"))
    stacked = np.stack(pixels) if pixels else np.empty((0, 3, size, size), dtype=np.uint8)
    texts = None if candidates is None else [candidates[j] for j in kept]
    return Chunk(stacked, np.asarray(labels, dtype=np.int64), skipped, texts)


def labels_from(values: list, column: str, where: str) -> tuple[list[int], list[str]]:
    """Label values -> (indices, class names): names sorted; integers keep their value (names "0", "1", ...)."""
    if all(isinstance(v, int) or (isinstance(v, str) and v.strip().lstrip("-").isdigit()) for v in values):
        ints = [int(v) for v in values]
        if min(ints) < 0:
            raise ValueError(f"{where}: column {column!r} has negative labels; use 0..K-1 or class names")
        return ints, [str(i) for i in range(max(ints) + 1)]
    names = sorted({str(v) for v in values})
    index = {n: i for i, n in enumerate(names)}
    return [index[str(v)] for v in values], names


def slug(name: str) -> str:
    """A name safe in a store folder's name: letters, digits, - and _, at most 40 characters."""
    return "".join(c if c.isalnum() or c in "-_" else "-" for c in name)[:40] or "data"


def content_key(files: Iterable[tuple[str, str | Path, object]], extra: str = "") -> str:
    """A hash of each file's (name, path, tag): the name, the size and modification time at the path, and the tag
    (a label, or ""). Any change to a file changes the key, and so prepares the store again; a missing file hashes
    as missing. Names relative to the data's folder keep the key when the folder moves."""
    h = hashlib.sha256(extra.encode())
    for name, path, tag in files:
        try:
            st = os.stat(path)
            h.update(f"{name}\0{st.st_size}\0{st.st_mtime_ns}\0{tag}\n".encode())
        except OSError:
            h.update(f"{name}\0missing\0{tag}\n".encode())
    return h.hexdigest()

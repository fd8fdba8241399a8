"""What a store is prepared from: an image folder, the synthetic shapes, CIFAR-10's python files.

A source lists its items up front (cheap: names and sizes, no pixels), has a fingerprint that changes
whenever its content would (files added, removed or modified), and reads any range of items as pixels at
a given size. Unreadable items are skipped and reported with the reason, never fatal on their own.

Image folders come in three layouts:
- class sub-folders, `root/<class>/**/<image>` (torchvision's ImageFolder order: classes sorted, files
  sorted within each), labelled by folder;
- a flat folder of images, unconditional;
- Hugging Face's `imagefolder` convention: `root/metadata.csv` or `metadata.jsonl` with a `file_name`
  column (relative to root) and, optionally, a label column (`data.label_column`).
"""

from __future__ import annotations

import csv
import functools
import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from denoiser.data.decode import decode_image, is_image_name

__all__ = ["Chunk", "Source", "FolderSource", "SyntheticSource", "Cifar10Source", "list_folder"]

METADATA = ("metadata.csv", "metadata.jsonl")


@dataclass
class Chunk:
    """Some items read: the usable ones' pixels (n, 3, S, S) uint8 and labels (n,), and the skipped ones."""

    pixels: np.ndarray
    labels: np.ndarray
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (item, why)


class Source:
    """Base of the sources: `name`, `classes`, `len()`, `fingerprint()` and `read(start, stop, size)`."""

    name = "source"
    classes: list[str]  # class names; empty for an unconditional set
    parallel = True  # worth decoding in worker processes

    def __len__(self) -> int:
        raise NotImplementedError

    def fingerprint(self) -> str:
        raise NotImplementedError

    def read(self, start: int, stop: int, size: int) -> Chunk:
        raise NotImplementedError


def _gather(items: list[tuple[str, int]], size: int, decode) -> Chunk:
    """Decode (item, label) pairs with `decode(item) -> (3, S, S) uint8`, skipping the failures."""
    pixels, labels, skipped = [], [], []
    for item, label in items:
        try:
            pixels.append(decode(item))
            labels.append(label)
        except Exception as err:  # noqa: BLE001 - any failure of one file skips that file, with its reason
            skipped.append((item, f"{type(err).__name__}: {err}"))
    stacked = np.stack(pixels) if pixels else np.empty((0, 3, size, size), dtype=np.uint8)
    return Chunk(stacked, np.asarray(labels, dtype=np.int64), skipped)


@dataclass
class FolderSource(Source):
    root: Path
    files: list[str]  # relative to root, in store order
    labels: list[int]
    classes: list[str]
    key: str  # file names, sizes, mtimes and labels, hashed
    name: str = "folder"

    def __len__(self) -> int:
        return len(self.files)

    def fingerprint(self) -> str:
        return self.key

    def read(self, start: int, stop: int, size: int) -> Chunk:
        def decode(rel: str) -> np.ndarray:
            if not is_image_name(rel):
                raise ValueError("not an image file (unknown extension)")
            return decode_image(self.root / rel, size)

        return _gather(list(zip(self.files[start:stop], self.labels[start:stop])), size, decode)


def _walk(folder: Path) -> list[Path]:
    """Files under `folder`, in ImageFolder's order (sorted walk, sorted names), hidden ones left out."""
    found = []
    for here, dirs, names in sorted(os.walk(folder, followlinks=True)):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        if any(part.startswith(".") for part in Path(here).relative_to(folder).parts):
            continue
        found += [Path(here) / n for n in sorted(names) if not n.startswith(".")]
    return found


def _read_metadata(path: Path) -> list[dict]:
    if path.suffix == ".csv":
        with open(path, newline="") as f:
            return list(csv.DictReader(f))
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _labels_from(values: list, column: str, where: str) -> tuple[list[int], list[str]]:
    """Label values -> (indices, class names): names sorted; integers keep their value (names "0", "1", ...)."""
    if all(isinstance(v, int) or (isinstance(v, str) and v.strip().lstrip("-").isdigit()) for v in values):
        ints = [int(v) for v in values]
        if min(ints) < 0:
            raise ValueError(f"{where}: column {column!r} has negative labels; use 0..K-1 or class names")
        return ints, [str(i) for i in range(max(ints) + 1)]
    names = sorted({str(v) for v in values})
    index = {n: i for i, n in enumerate(names)}
    return [index[str(v)] for v in values], names


def _from_metadata(root: Path, meta: Path, label_column: str | None) -> tuple[list[str], list[int], list[str]]:
    rows = _read_metadata(meta)
    if not rows:
        raise ValueError(f"{meta} lists no images; add rows with a file_name column")
    files = [str(r["file_name"]) for r in rows]
    if label_column and label_column in rows[0]:
        labels, classes = _labels_from([r[label_column] for r in rows], label_column, str(meta))
    else:  # no label column: unconditional
        labels, classes = [0] * len(files), []
    return files, labels, classes


def list_folder(path: str | Path, label_column: str | None = "label") -> FolderSource:
    """The files of an image folder in one of the three layouts (see the module docstring), with their labels."""
    root = Path(path).expanduser()
    if not root.is_dir():
        raise FileNotFoundError(f"data folder {str(root)!r} does not exist; set data.path to an image folder")
    meta = next((root / m for m in METADATA if (root / m).is_file() and _has_file_name(root / m)), None)
    if meta is not None:
        files, labels, classes = _from_metadata(root, meta, label_column)
        extra = hashlib.sha256(meta.read_bytes()).hexdigest()
    else:
        class_dirs = sorted(d for d in root.iterdir() if d.is_dir() and not d.name.startswith("."))
        nested = [(i, f) for i, d in enumerate(class_dirs) for f in _walk(d)]
        if nested:  # class sub-folders; images loose in root are left out (ImageFolder ignores them too)
            classes = [d.name for d in class_dirs]
            files = [str(f.relative_to(root)) for _, f in nested]
            labels = [i for i, _ in nested]
        else:  # a flat folder: unconditional
            files = [f.name for f in _walk(root) if f.parent == root and f.name not in METADATA]
            labels, classes = [0] * len(files), []
        extra = ""
    if not files:
        raise ValueError(
            f"no images found in {str(root)!r}: expected class sub-folders with .jpg/.png files "
            "(root/cat/001.png), images directly in the folder, or a metadata.csv with a file_name column"
        )
    return FolderSource(root, files, labels, classes, _folder_key(root, files, labels, extra), name=_slug(root.name))


def _has_file_name(meta: Path) -> bool:
    with open(meta) as f:
        first = f.readline()
    return "file_name" in (first.split(",") if meta.suffix == ".csv" else json.loads(first or "{}"))


def _folder_key(root: Path, files: list[str], labels: list[int], extra: str) -> str:
    """A hash of every file's name, size, modification time and label: any change prepares the store again."""
    h = hashlib.sha256(extra.encode())
    for rel, label in zip(files, labels):
        try:
            st = os.stat(root / rel)
            h.update(f"{rel}\0{st.st_size}\0{st.st_mtime_ns}\0{label}\n".encode())
        except OSError:
            h.update(f"{rel}\0missing\0{label}\n".encode())
    return h.hexdigest()


def _slug(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_" else "-" for c in name)[:40] or "data"


@dataclass
class SyntheticSource(Source):
    num_images: int
    seed: int
    name: str = "synthetic"

    def __post_init__(self):
        from denoiser.data.synthetic import SHAPES

        if self.num_images < 1:
            raise ValueError(f"data.num_images must be at least 1, got {self.num_images}")
        self.classes = list(SHAPES)

    def __len__(self) -> int:
        return self.num_images

    def fingerprint(self) -> str:
        return f"synthetic-{self.num_images}-{self.seed}"

    def read(self, start: int, stop: int, size: int) -> Chunk:
        from denoiser.data.synthetic import synthetic_images

        return Chunk(*synthetic_images(start, stop, size, self.seed))


@dataclass
class Cifar10Source(Source):
    """CIFAR-10 in its python format (`cifar-10-batches-py` under `path`), training batches; never downloads."""

    path: Path
    name: str = "cifar10"
    parallel = False  # already decoded: one process reads it in seconds

    @property
    def classes(self) -> list[str]:
        return list(_cifar10(str(self.path)).classes)

    def __len__(self) -> int:
        return len(_cifar10(str(self.path)).data)

    def fingerprint(self) -> str:
        """From the files' sizes and times: a prepared store opens without unpickling the 150 MB batches."""
        folder = Path(self.path) / "cifar-10-batches-py"
        if not folder.is_dir():
            _cifar10(str(self.path))  # raises, explaining what is missing
        return "cifar10-" + "-".join(f"{p.name}:{p.stat().st_size}:{p.stat().st_mtime_ns}" for p in sorted(folder.iterdir()))

    def read(self, start: int, stop: int, size: int) -> Chunk:
        import torch
        from torchvision.transforms import functional as TF

        ds = _cifar10(str(self.path))
        images = torch.from_numpy(ds.data[start:stop]).permute(0, 3, 1, 2).contiguous()  # (n, 32, 32, 3) -> (n, 3, 32, 32)
        if size != images.shape[-1]:
            images = TF.resize(images, [size, size], antialias=True)
        return Chunk(images.numpy(), np.asarray(ds.targets[start:stop], dtype=np.int64))


@functools.cache
def _cifar10(path: str):
    from torchvision import datasets

    try:
        return datasets.CIFAR10(path, train=True, download=False)
    except RuntimeError as err:
        raise FileNotFoundError(
            f"no CIFAR-10 python files under {path!r} ({err}); put cifar-10-batches-py there, "
            "or use dataset: folder for an image folder"
        ) from None

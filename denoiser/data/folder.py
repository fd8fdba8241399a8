"""An image folder as a source (`data.dataset: folder`), in one of three layouts:
- class sub-folders, `root/<class>/**/<image>` (torchvision's ImageFolder order: classes sorted, files
  sorted within each), labelled by folder;
- a flat folder of images, unconditional;
- Hugging Face's `imagefolder` convention: `root/metadata.csv` or `metadata.jsonl` with a `file_name`
  column (relative to root) and, optionally, a label column (`data.label_column`).

Captions (`data.caption_columns`, denoiser/data/captions.py) come from the folder's metadata.csv or metadata.jsonl
in any layout: its rows name their image in a `file_name` column (or `file`, as the emoji set's metadata.csv does),
relative to root; an image no row names has no text. The metadata file is then part of the store's key.
"""

from __future__ import annotations

import csv
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from denoiser.data.base import Chunk, Source, content_key, gather, labels_from, slug
from denoiser.data.captions import Candidates, CaptionSpec
from denoiser.data.decode import decode_image, is_image_name

__all__ = ["FolderSource", "list_folder"]

METADATA = ("metadata.csv", "metadata.jsonl")


@dataclass
class FolderSource(Source):
    root: Path
    files: list[str]  # relative to root, in store order
    labels: list[int]
    classes: list[str]
    key: str  # file names, sizes, mtimes and labels, hashed
    name: str = "folder"
    caption_spec: CaptionSpec | None = None
    candidates: list[Candidates] | None = None  # each file's caption groups (when caption_spec asks for text)

    def __len__(self) -> int:
        return len(self.files)

    def fingerprint(self) -> str:
        return self.key

    def read(self, start: int, stop: int, size: int) -> Chunk:
        def decode(rel: str) -> np.ndarray:
            if not is_image_name(rel):
                raise ValueError("not an image file (unknown extension)")
            return decode_image(self.root / rel, size)

        texts = None if self.candidates is None else self.candidates[start:stop]
        return gather(list(zip(self.files[start:stop], self.labels[start:stop])), size, decode, texts)


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


def _from_metadata(root: Path, meta: Path, label_column: str | None) -> tuple[list[str], list[int], list[str]]:
    rows = _read_metadata(meta)
    if not rows:
        raise ValueError(f"{meta} lists no images; add rows with a file_name column")
    files = [str(r["file_name"]) for r in rows]
    if label_column and label_column in rows[0]:
        labels, classes = labels_from([r[label_column] for r in rows], label_column, str(meta))
    else:  # no label column: unconditional
        labels, classes = [0] * len(files), []
    return files, labels, classes


def list_folder(path: str | Path, label_column: str | None = "label", captions: CaptionSpec | None = None) -> FolderSource:
    """The files of an image folder in one of the three layouts (see the module docstring), with their labels, and
    their caption groups when `captions` asks for text."""
    root = Path(path).expanduser()
    if not root.is_dir():
        raise FileNotFoundError(f"data folder {str(root)!r} does not exist; set data.path to an image folder")
    meta = next((root / m for m in METADATA if (root / m).is_file() and _has_file_name(root / m)), None)
    texts, text_key = (None, "") if captions is None else _captions(root, captions)
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
    candidates = None if texts is None else [texts.get(str(Path(f)), []) for f in files]
    return FolderSource(root, files, labels, classes, _folder_key(root, files, labels, extra + text_key),
                        name=slug(root.name), caption_spec=captions, candidates=candidates)


def _captions(root: Path, spec: CaptionSpec) -> tuple[dict[str, Candidates], str]:
    """(file relative to root -> caption groups, hash of the metadata file) from the folder's metadata.csv/jsonl."""
    meta = next((root / m for m in METADATA if (root / m).is_file()), None)
    if meta is None:
        raise ValueError(f"data.caption_columns needs a metadata.csv or metadata.jsonl in {str(root)!r}, with a "
                         f"file_name (or file) column naming each image and the text columns; there is none. Add one, "
                         "or set data.caption_columns to [] for no captions")
    rows = _read_metadata(meta)
    columns = list(dict.fromkeys(c for r in rows for c in r))  # csv: the header; jsonl: every key seen
    spec.check(columns, str(meta))
    name = next((c for c in ("file_name", "file") if c in columns), None)
    if name is None:
        raise ValueError(f"{meta} has no file_name (or file) column to tell which image each row describes (its "
                         f"columns: {', '.join(columns)}); add one, with each image's path relative to {str(root)!r}")
    by_file = {str(Path(str(r[name]))): spec.candidates([r.get(c) for c in spec.columns]) for r in rows if r.get(name)}
    return by_file, hashlib.sha256(meta.read_bytes()).hexdigest()


def _has_file_name(meta: Path) -> bool:
    with open(meta) as f:
        first = f.readline()
    return "file_name" in (first.split(",") if meta.suffix == ".csv" else json.loads(first or "{}"))


def _folder_key(root: Path, files: list[str], labels: list[int], extra: str) -> str:
    """Every file's name, size, modification time and label, hashed: any change prepares the store again."""
    return content_key(((rel, root / rel, label) for rel, label in zip(files, labels)), extra)

"""Hugging Face `datasets` as a source: a `save_to_disk` folder, a folder of parquet or arrow files, or a
dataset name already in the local `datasets` cache (read offline; nothing is downloaded).

Images are read as their stored bytes (or path) and decoded by `denoiser.data.decode`, like a folder's
files: the same EXIF handling, JPEG draft decoding and resize to `sample_size`. A `ClassLabel` column's
names become the class names (the exported model's classes.txt); integer labels keep their values and
string labels are sorted into names.
"""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from denoiser.data.decode import decode_image
from denoiser.data.sources import Chunk, Source, _gather, _labels_from, _slug

__all__ = ["HFSource", "open_hf"]


def _files_key(files: list[Path]) -> str:
    h = hashlib.sha256()
    for f in files:
        st = f.stat()
        h.update(f"{f}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return h.hexdigest()


@functools.cache
def open_hf(path: str, split: str, cache_dir: str | None = None):
    """(dataset, content key) for `data.path`: a map-style `datasets.Dataset`, memory-mapped where it can be."""
    import datasets

    folder = Path(path).expanduser()
    if folder.is_dir() and ((folder / "state.json").is_file() or (folder / "dataset_dict.json").is_file()):
        ds = datasets.load_from_disk(str(folder))
        key = None
    elif folder.is_dir():
        arrows, parquets = sorted(folder.rglob("*.arrow")), sorted(folder.rglob("*.parquet"))
        if arrows:
            ds = datasets.concatenate_datasets([datasets.Dataset.from_file(str(f)) for f in arrows])
        elif parquets:  # converted to Arrow once, into our cache folder
            ds = datasets.load_dataset("parquet", data_files=[str(f) for f in parquets], split="train", cache_dir=cache_dir)
        else:
            raise ValueError(f"data.path {path!r} holds no save_to_disk dataset, .arrow or .parquet files; "
                             "point it at one of those, or use data.dataset: folder for image files")
        key = _files_key(arrows or parquets)
    else:
        try:
            ds = datasets.load_dataset(path, split=split, cache_dir=cache_dir)
        except Exception as err:  # noqa: BLE001 - offline: anything not in the cache fails here
            raise ValueError(f"data.path {path!r} is neither a folder nor a dataset in the local datasets cache "
                             f"({type(err).__name__}: {err}); download it once with datasets.load_dataset and "
                             "save_to_disk, then set data.path to that folder") from None
        key = None
    if isinstance(ds, datasets.DatasetDict):
        if split not in ds:
            raise ValueError(f"{path!r} has the splits {list(ds)}, not {split!r}; set data.split to one of them")
        ds = ds[split]
    return ds, key or ds._fingerprint


@dataclass
class HFSource(Source):
    path: str
    image_column: str = "image"
    label_column: str | None = "label"
    split: str = "train"
    cache_dir: str | None = None
    name: str = "hf"
    label_map: dict | None = field(default=None, repr=False)  # stored label value -> class index (non-ClassLabel)

    def __post_init__(self):
        from datasets import ClassLabel, Image

        ds, self._key = open_hf(self.path, self.split, self.cache_dir)
        self.name = "hf-" + _slug(Path(self.path).name or self.path)
        feats = ds.features
        if self.image_column not in feats:
            raise ValueError(f"{self.path!r} has no column {self.image_column!r} (columns: {', '.join(feats)}); "
                             "set data.image_column")
        if not isinstance(feats[self.image_column], Image):
            raise ValueError(f"column {self.image_column!r} of {self.path!r} is {feats[self.image_column]}, not an "
                             "Image feature; set data.image_column to the image column")
        self.classes, self._labelled = [], bool(self.label_column) and self.label_column in feats
        if self._labelled:
            feature = feats[self.label_column]
            if isinstance(feature, ClassLabel):
                self.classes = list(feature.names)
            else:
                values = ds.with_format("arrow")[self.label_column].to_pylist()
                indices, self.classes = _labels_from(values, self.label_column, self.path)
                self.label_map = dict(zip(values, indices))
        self._n = len(ds)

    def __len__(self) -> int:
        return self._n

    def fingerprint(self) -> str:
        return f"{self._key}\0{self.split}\0{self.image_column}\0{self.label_column if self._labelled else ''}"

    def read(self, start: int, stop: int, size: int) -> Chunk:
        ds, _ = open_hf(self.path, self.split, self.cache_dir)
        rows = ds.with_format("arrow")[start:stop]
        images = rows[self.image_column].to_pylist()  # {"bytes": ..., "path": ...}
        labels = rows[self.label_column].to_pylist() if self._labelled else [0] * len(images)
        if self.label_map is not None:
            labels = [self.label_map[v] for v in labels]
        names = [f"row {start + i}" for i in range(len(images))]
        by_name = dict(zip(names, images))

        def decode(name: str) -> np.ndarray:
            image = by_name[name]
            if not image or not (image.get("bytes") or image.get("path")):
                raise ValueError("no image in this row")
            return decode_image(image["bytes"] or image["path"], size)

        return _gather(list(zip(names, labels)), size, decode)

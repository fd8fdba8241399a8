"""Hugging Face `datasets` as a source: a `save_to_disk` folder, a folder of parquet or arrow files, or a
dataset name already in the local `datasets` cache (read offline; nothing is downloaded).

Images are read as their stored bytes (or path) and decoded by `denoiser.data.decode`, like a folder's
files: the same EXIF handling, JPEG draft decoding and resize to `sample_size`. A `ClassLabel` column's
names become the class names (the exported model's classes.txt); integer labels keep their values and
string labels are sorted into names. Caption columns (`data.caption_columns`) hold a string or a list of strings.

With `data.streaming: true` the dataset's files are a stream's shards instead (`HFShards`, one per file): the
Arrow files behind a save_to_disk folder or a cached dataset, memory-mapped and read in place, or a folder's parquet
files, read a row group at a time. We read the files ourselves rather than through `datasets`' IterableDataset:
the stream's resume guarantee needs items addressable by (file, row) without decoding (denoiser/data/stream.py),
and an IterableDataset restored from its state_dict refills its shuffle buffer afresh instead of replaying it.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from denoiser.data.base import Chunk, Shards, Source, content_key, gather, labels_from, slug
from denoiser.data.captions import CaptionSpec
from denoiser.data.decode import decode_image

__all__ = ["HFSource", "HFShards", "open_hf"]


def _files_key(files: list[Path]) -> str:
    return content_key((str(f), f, "") for f in files)


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


def _check_columns(feats, path: str, image_column: str, label_column: str | None,
                   captions: CaptionSpec | None = None) -> bool:
    """Check the image column is an Image feature and the caption columns are there; returns whether the label
    column is there."""
    from datasets import Image

    if captions is not None:
        captions.check(feats, repr(path))
    if image_column not in feats:
        raise ValueError(f"{path!r} has no column {image_column!r} (columns: {', '.join(feats)}); set data.image_column")
    if not isinstance(feats[image_column], Image):
        raise ValueError(f"column {image_column!r} of {path!r} is {feats[image_column]}, not an Image feature; "
                         "set data.image_column to the image column")
    return bool(label_column) and label_column in feats


def _label_names(feature, values: list, column: str, where: str) -> tuple[list[int], list[str], dict | None]:
    """(class indices, class names, stored value -> index or None): a ClassLabel's own names and values, else
    `labels_from` (integers keep their value, strings are sorted into names)."""
    from datasets import ClassLabel

    if isinstance(feature, ClassLabel):
        return [int(v) for v in values], list(feature.names), None
    indices, classes = labels_from(values, column, where)
    return indices, classes, dict(zip(values, indices))


@dataclass
class HFSource(Source):
    path: str
    image_column: str = "image"
    label_column: str | None = "label"
    split: str = "train"
    cache_dir: str | None = None
    name: str = "hf"
    label_map: dict | None = field(default=None, repr=False)  # stored label value -> class index (non-ClassLabel)
    caption_spec: CaptionSpec | None = None

    def __post_init__(self):
        ds, self._key = open_hf(self.path, self.split, self.cache_dir)
        self.name = "hf-" + slug(Path(self.path).name or self.path)
        self._labelled = _check_columns(ds.features, self.path, self.image_column, self.label_column, self.caption_spec)
        self.classes = []
        if self._labelled:
            values = ds.with_format("arrow")[self.label_column].to_pylist()
            _, self.classes, self.label_map = _label_names(ds.features[self.label_column], values, self.label_column, self.path)
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
        texts = None
        if self.caption_spec is not None:
            values = zip(*(rows[c].to_pylist() for c in self.caption_spec.columns))
            texts = [self.caption_spec.candidates(v) for v in values]

        def decode(name: str) -> np.ndarray:
            return decode_image(_encoded(by_name[name]), size)

        return gather(list(zip(names, labels)), size, decode, texts)


def _encoded(image: dict | None) -> bytes | str:
    """An Image feature's stored value, {"bytes": ..., "path": ...} -> what `decode_image` reads."""
    if not image or not (image.get("bytes") or image.get("path")):
        raise ValueError("no image in this row")
    return image["bytes"] or image["path"]


def _shard_files(path: str, split: str, cache_dir: str | None) -> tuple[list[Path], bool]:
    """(files, parquet?) of `data.path` as a stream's shards: a folder's .arrow or .parquet files, else the Arrow
    files behind a save_to_disk folder or a cached dataset (read in place, never converted)."""
    folder = Path(path).expanduser()
    saved = (folder / "state.json").is_file() or (folder / "dataset_dict.json").is_file()
    if folder.is_dir() and not saved:
        arrows, parquets = sorted(folder.rglob("*.arrow")), sorted(folder.rglob("*.parquet"))
        if arrows or parquets:
            return arrows or parquets, not arrows
        raise ValueError(f"data.path {path!r} holds no save_to_disk dataset, .arrow or .parquet files; "
                         "point it at one of those, or use data.dataset: folder for image files")
    ds, _ = open_hf(path, split, cache_dir)
    files = [Path(f["filename"]) for f in ds.cache_files]
    if sum(_ArrowFile(f).num_rows for f in files) != len(ds):
        raise ValueError(f"{path!r} is not laid out as whole Arrow files (an indices mapping, or held in memory), so it "
                         "cannot be streamed; save it with save_to_disk(path, num_shards=N) and point data.path there")
    return files, False


class _ArrowFile:
    """One Arrow file of a `datasets` dataset, memory-mapped: a row is read in place."""

    def __init__(self, path: Path):
        from datasets import Dataset

        ds = Dataset.from_file(str(path))  # memory-mapped, nothing copied
        self.features, self.table, self.num_rows = ds.features, ds.data.table, len(ds)

    def column(self, name: str) -> list:
        return self.table.column(name).to_pylist()

    def value(self, name: str, row: int):
        return self.table.column(name)[row].as_py()


class _ParquetFile:
    """One parquet file, read a row group at a time; the last `keep` groups stay decompressed."""

    def __init__(self, path: Path, keep: int = 4):
        import pyarrow.parquet as pq
        from datasets import Features

        self.file, self.keep, self.groups = pq.ParquetFile(path), keep, {}
        self.features = Features.from_arrow_schema(self.file.schema_arrow)  # ClassLabel names from its metadata
        meta = self.file.metadata
        self.num_rows = meta.num_rows
        self.starts = np.cumsum([0] + [meta.row_group(g).num_rows for g in range(meta.num_row_groups)])

    def column(self, name: str) -> list:
        return self.file.read(columns=[name]).column(name).to_pylist()

    def value(self, name: str, row: int):
        g = int(np.searchsorted(self.starts, row, side="right")) - 1
        if (name, g) not in self.groups:
            if len(self.groups) >= self.keep:
                self.groups.pop(next(iter(self.groups)))  # the oldest
            self.groups[(name, g)] = self.file.read_row_group(g, columns=[name]).column(name)
        return self.groups[(name, g)][row - int(self.starts[g])].as_py()


class HFShards(Shards):
    """A Hugging Face dataset's files as a stream's shards (data.streaming: true), one shard per file: the Arrow
    files of a save_to_disk folder or cached dataset (memory-mapped), or a folder's .arrow or .parquet files. Only
    the label and caption columns are read up front; labels and class names follow the store's rules (`_label_names`)."""

    def __init__(self, path: str, image_column: str = "image", label_column: str | None = "label", split: str = "train",
                 cache_dir: str | None = None, captions: CaptionSpec | None = None):
        self.where, self.image_column, self.dropped = path, image_column, []
        self.paths, self.parquet = _shard_files(path, split, cache_dir)
        self._pid, self._readers = os.getpid(), {}
        files = [self._reader(s) for s in range(len(self.paths))]
        features = files[0].features
        labelled = _check_columns(features, path, image_column, label_column, captions)
        if captions is not None:  # small text, read up front as the labels are
            self.candidates = [[captions.candidates(v) for v in zip(*(f.column(c) for c in captions.columns))]
                               for f in files]
        self.sizes = [f.num_rows for f in files]
        values = [v for f in files for v in (f.column(label_column) if labelled else [0] * f.num_rows)]
        self.classes = []
        if labelled:
            values, self.classes, _ = _label_names(features[label_column], values, label_column, path)
        self.labels = np.split(np.asarray(values, dtype=np.int64), np.cumsum(self.sizes)[:-1])

    def _reader(self, shard: int) -> _ArrowFile | _ParquetFile:
        """Shard `shard`'s file, opened once per process (a forked DataLoader worker opens its own)."""
        if self._pid != os.getpid():
            self._pid, self._readers = os.getpid(), {}
        if shard not in self._readers:
            self._readers[shard] = (_ParquetFile if self.parquet else _ArrowFile)(self.paths[shard])
        return self._readers[shard]

    def encoded(self, shard: int, item: int) -> bytes | str:
        return _encoded(self._reader(shard).value(self.image_column, item))

    def item_name(self, shard: int, item: int) -> str:
        return f"{self.paths[shard].name} row {item}"

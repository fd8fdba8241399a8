"""The prepared store: a source decoded once at one size into an Arrow file that every process memory-maps.

    $DENOISER_CACHE/data/<name>-<size>px-<key>/   (default ~/.cache/denoiser/data/...)
        data.arrow    a `datasets` Arrow file: `pixels` (3*S*S uint8, CHW) and `label`, and `captions` (each image's
                      candidate captions, list<list<string>>) when the data config asks for text; open it with
                      datasets.Dataset.from_file
        store.json    source, size, counts, classes, caption columns
        skipped.txt   every item left out, with the reason

The key hashes the source's fingerprint (for a folder: every file's name, size, mtime and label), the
size, and the captions asked for (if any), so a changed folder, another size or other captions are prepared
again, next to the old store. Concurrent preparers
(processes of one run, runs on two machines over a shared filesystem) take an exclusive lock on
`.<store>.lock`: one prepares into a temporary folder and renames it into place, the others wait for the
lock and then open the finished store. A killed preparer leaves only a temporary folder, removed by the next.
Clearing the cache is `rm -rf $DENOISER_CACHE/data` (or one store folder); it is rebuilt on the next run.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import fcntl
import hashlib
import json
import logging
import multiprocessing
import os
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from denoiser.atomic import atomic_path, remove_temporaries
from denoiser.data.base import Chunk, Source
from denoiser.data.captions import CaptionTable
from denoiser.data.images import ImageDataset, MappedImages

__all__ = ["StoreInfo", "cache_root", "store_path", "prepare_store", "open_store"]

logger = logging.getLogger(__name__)

FORMAT = 1  # bump when the decoding changes: every store is prepared again
CACHE_ENV = "DENOISER_CACHE"


def cache_root() -> Path:
    """`$DENOISER_CACHE`, else `$XDG_CACHE_HOME/denoiser`, else `~/.cache/denoiser`."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "denoiser"


def store_path(source: Source, size: int) -> Path:
    text = f"\0{source.caption_spec.key}" if source.caption_spec else ""  # none asked: the key stores had before captions
    key = hashlib.sha256(f"{FORMAT}\0{source.fingerprint()}\0{size}{text}".encode()).hexdigest()[:16]
    return cache_root() / "data" / f"{source.name}-{size}px-{key}"


@dataclass
class StoreInfo:
    path: Path
    num_items: int  # items in the source
    num_images: int  # usable images in the store
    skipped: int
    prepared_seconds: float

    @property
    def skipped_file(self) -> Path:
        return self.path / "skipped.txt"


def _ready(path: Path) -> bool:
    return (path / "store.json").is_file()


@contextlib.contextmanager
def _lock(path: Path) -> Iterator[None]:
    """An exclusive lock held while the block runs (flock: released by the OS if the holder dies)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def prepare_store(source: Source, size: int, num_workers: int | None = None, progress: bool = True) -> StoreInfo:
    """The store of `source` at `size`: opened if it exists, else prepared (or waited for) first."""
    path = store_path(source, size)
    if not _ready(path):
        with _lock(path.with_name(f".{path.name}.lock")):
            if not _ready(path):  # nobody prepared it while we waited
                _prepare(source, size, path, num_workers, progress)
    info = _info(path)
    if info.num_images == 0:
        raise ValueError(_nothing_usable(path))
    return info


def _info(path: Path) -> StoreInfo:
    meta = json.loads((path / "store.json").read_text())
    return StoreInfo(path, meta["num_items"], meta["num_images"], meta["skipped"], meta["prepared_seconds"])


def _ranges(n: int, workers: int) -> list[tuple[int, int]]:
    step = max(16, min(1024, n // (workers * 16) or 1))  # enough tasks to balance, few enough to be cheap
    return [(s, min(n, s + step)) for s in range(0, n, step)]


_WORKER_SOURCE: Source | None = None


def _init_worker(source: Source) -> None:
    global _WORKER_SOURCE
    _WORKER_SOURCE = source
    torch.set_num_threads(1)


def _read(task: tuple[int, int, int]) -> Chunk:
    return _WORKER_SOURCE.read(*task)


def _chunks(source: Source, size: int, num_workers: int | None) -> Iterator[Chunk]:
    """The source read in order, over worker processes: `num_workers`, or every core for 512 items and more.

    Workers are forked, like a DataLoader's: they only decode with PIL and numpy, and set one torch thread."""
    workers = num_workers or len(os.sched_getaffinity(0))
    ranges = _ranges(len(source), workers)
    if workers <= 1 or not source.parallel or (num_workers is None and len(source) < 512):
        yield from (source.read(a, b, size) for a, b in ranges)
        return
    ctx = multiprocessing.get_context("fork")
    with concurrent.futures.ProcessPoolExecutor(workers, ctx, initializer=_init_worker, initargs=(source,)) as pool:
        yield from pool.map(_read, [(a, b, size) for a, b in ranges])


def _prepare(source: Source, size: int, path: Path, num_workers: int | None, progress: bool) -> None:
    import pyarrow as pa
    from datasets import ClassLabel, Features, List, Value
    from datasets.arrow_writer import ArrowWriter
    from tqdm.auto import tqdm

    started = time.monotonic()
    remove_temporaries(path)  # a killed preparer's leftovers (we hold the lock)
    label = ClassLabel(names=source.classes) if source.classes else Value("int64")
    features = Features({"pixels": List(Value("uint8"), length=3 * size * size), "label": label})
    if source.caption_spec:
        features["captions"] = List(List(Value("string")))
    num_images, skipped = 0, []
    with atomic_path(path, tag=f"{socket.gethostname()}-{os.getpid()}") as tmp:  # readers see no store or a whole one
        tmp.mkdir()
        writer = ArrowWriter(features=features, path=str(tmp / "data.arrow"))
        bar = tqdm(total=len(source), desc=f"preparing {source.name} at {size}px", unit="img", disable=not progress)
        for chunk in _chunks(source, size, num_workers):
            if len(chunk.labels):
                flat = pa.array(chunk.pixels.reshape(-1))  # (n, 3, S, S) -> n*3*S*S values, zero-copy
                columns = {"pixels": pa.FixedSizeListArray.from_arrays(flat, 3 * size * size), "label": pa.array(chunk.labels)}
                if source.caption_spec:
                    columns["captions"] = pa.array(chunk.candidates, type=pa.list_(pa.list_(pa.string())))
                writer.write_table(pa.table(columns))
            num_images += len(chunk.labels)
            skipped += chunk.skipped
            bar.update(len(chunk.labels) + len(chunk.skipped))
        bar.close()
        writer.finalize()
        (tmp / "skipped.txt").write_text("".join(f"{item}\t{why}\n" for item, why in skipped))
        meta = {"format": FORMAT, "source": source.name, "fingerprint": source.fingerprint(), "size": size,
                "layout": "pixels: 3*size*size uint8 per image, (C, H, W) row-major", "classes": source.classes,
                "caption_columns": list(source.caption_spec.columns) if source.caption_spec else [],
                "num_items": len(source), "num_images": num_images, "skipped": len(skipped),
                "prepared_seconds": round(time.monotonic() - started, 2), "workers": num_workers or len(os.sched_getaffinity(0))}
        (tmp / "store.json").write_text(json.dumps(meta, indent=1))
    logger.info("prepared %s: %d images in %.1f s", path, num_images, time.monotonic() - started)


def open_store(path: Path) -> ImageDataset:
    """The store's images, memory-mapped (nothing decoded, nothing copied), with labels, class names and candidate
    captions (when it has them)."""
    from datasets import Dataset

    meta = json.loads((path / "store.json").read_text())
    S = meta["size"]
    table = Dataset.from_file(str(path / "data.arrow")).data.table  # memory-mapped Arrow
    chunks = [c.flatten().to_numpy(zero_copy_only=True).reshape(-1, 3, S, S) for c in table.column("pixels").chunks]
    labels = torch.from_numpy(table.column("label").to_numpy().astype(np.int64))
    candidates = CaptionTable(table.column("captions")) if "captions" in table.column_names else None
    return ImageDataset(MappedImages(chunks), labels, list(meta["classes"]), store=path, candidates=candidates)


def _nothing_usable(path: Path) -> str:
    meta = json.loads((path / "store.json").read_text())
    lines = (path / "skipped.txt").read_text().splitlines()
    shown = "; ".join(line.replace("\t", ": ") for line in lines[:3])
    return (f"no usable images in {meta['source']}: all {meta['num_items']} files were skipped ({shown}"
            f"{' ...' if len(lines) > 3 else ''}); full list in {path / 'skipped.txt'}. Fix or remove them, "
            "or point data.path at the right folder")

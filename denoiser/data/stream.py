"""Streaming training data (`data.streaming: true`): each process reads its own shards through a seeded shuffle
buffer and decodes in DataLoader workers; nothing is prepared or written down, so the data may exceed the disk.

Shards: WebDataset tar files (`data.dataset: webdataset`, one shard per file) or a Hugging Face dataset's files
(`hf`: the Arrow files of a `save_to_disk` folder or of a cached dataset, or a folder's parquet files).

The order, for process r (global rank) of W, with n = train.batch_size / W images per process and step:
  - epoch e's shards are a permutation of the shards seeded by (train.seed, e); rank r takes every W-th, r, r+W, ...
  - rank r's items of epoch e are its shards one after another, each in stored order, through a shuffle buffer of
    `data.shuffle_buffer` items seeded by (train.seed, e, r) (WebDataset's buffer: once full, each arriving item
    takes the place of a uniformly drawn one, which comes out; at the end of the epoch the rest comes out shuffled);
  - the epochs follow one another without end: every rank takes as many steps as asked, however many items its
    shards hold;
  - step s is items [s·n, (s+1)·n) of rank r's stream; noise, timesteps, flips and label drops come from a
    generator seeded by (train.seed, s, r) (denoiser.train.command); each item's caption from (train.seed, s, its global
    item number) (denoiser/data/captions.py).
The order is computed in denoiser/data/order.py (`Cursor`); this module indexes the shards, holds out validation
and decodes each step's items.

An item is a *descriptor*, (shard, item within the shard), found from tar headers or row counts without decoding
anything, and the buffer's order is a function of its seed and the count of items. So the stream is computed, not
recorded, and the images of step s are a pure function of s: a DataLoader worker decodes whole steps, and how many
workers there are changes only who decodes a step, never what it holds.

What resume guarantees. Resumed at step k, with the same shards (same files and contents), the same config and
the same number of processes W, every rank replays its descriptors up to position k·n without reading an image and
continues from there: each later step takes exactly the images, labels, captions, noise, timesteps, flips and label drops of
the uninterrupted run, and the weights end equal to float tolerance (identical on the same machine and software).
`data.num_workers` may differ between the sittings: it only changes who decodes a step. (Nor does a step's content
depend on `train.gradient_accumulation_steps`, which only splits the rank's n images.) It does NOT hold:
  - on another number of processes: the shard split, and so every rank's stream, changes (the run continues, on
    another order; a warning says so);
  - when shards are added, removed, rewritten or listed in another order: descriptors point at other images;
  - against a run on another W: unlike the store (where any number of processes computes what one computes), a
    stream on W > 1 processes sees another order than on one process, since each rank has its own stream.

An item that cannot be decoded is skipped and counted (a warning names it and why), and its place in the step
takes the next decodable image of the same step (cyclically): the count of items per step never depends on what
decodes, which is what lets the replay skip without decoding. A WebDataset sample without an image member is left
out when the shards are indexed (also counted). A step where nothing decodes is an error naming the items.

Validation: the first `data.val_size` items of the shards in listed order (shard 0 first, into shard 1 if it holds
fewer) are held out, decoded once at the start on every process, and never trained on.
"""

from __future__ import annotations

import itertools
import logging
import os
from collections.abc import Iterator

import numpy as np
import torch

from denoiser.data.base import Shards
from denoiser.data.captions import CaptionPick, CaptionTable
from denoiser.data.config import DataConfig
from denoiser.data.decode import decode_image
from denoiser.data.images import ImageDataset, StepBatch
from denoiser.data.order import Cursor
from denoiser.data.sources import open_shards

__all__ = ["Stream", "StreamBatches", "open_stream", "stream_workers"]

logger = logging.getLogger(__name__)


def _decode(shards: Shards, shard: int, item: int, size: int) -> np.ndarray:
    return decode_image(shards.encoded(shard, item), size)


def decode_items(shards: Shards, items: np.ndarray, starts: np.ndarray, size: int, draw_key: tuple[int, ...],
                 pick: CaptionPick | None = None) -> StepBatch:
    """Decode descriptors (k, 2) into a StepBatch whose draws are its own (keyed `draw_key`, step first); a failed
    item's place takes the next decodable one (cyclically). With `pick` and captioned shards, each image's caption is
    picked for the step."""
    pixels: list[np.ndarray | None] = []
    skipped = []
    for s, i in items.tolist():
        try:
            pixels.append(_decode(shards, s, i, size))
        except Exception as err:  # noqa: BLE001 - any failure of one item skips that item, with its reason
            pixels.append(None)
            skipped.append((shards.item_name(s, i), f"{type(err).__name__}: {err}"))
    good = [j for j, p in enumerate(pixels) if p is not None]
    if not good:
        shown = "; ".join(f"{name}: {why}" for name, why in skipped[:3])
        raise ValueError(f"none of the {len(items)} items of a step in {shards.where!r} could be decoded ({shown}); "
                         "check the shards, or remove the broken ones from data.path")
    take = [j if pixels[j] is not None else _next_good(j, good) for j in range(len(pixels))]
    labels = np.array([shards.labels[s][i] for s, i in items.tolist()], dtype=np.int64)
    ids = (starts[items[:, 0]] + items[:, 1])[take]
    captions = None
    if pick is not None and shards.candidates is not None:
        kept = items[take].tolist()
        captions = pick([shards.candidates[s][i] for s, i in kept], ids.tolist(), draw_key[0])
    return StepBatch(torch.from_numpy(ids), torch.from_numpy(np.stack([pixels[j] for j in take])),
                     torch.from_numpy(labels[take]), draw_key, len(take), torch.arange(len(take)), captions, skipped)


def _next_good(j: int, good: list[int]) -> int:
    """The first decodable position after j, wrapping around."""
    return next((g for g in good if g > j), good[0])


def _holdout(sizes: list[int], val_size: int) -> list[int]:
    """Per shard, how many leading items the validation set takes: the first `val_size` items in listed order."""
    first, left = [], val_size
    for n in sizes:
        first.append(min(n, left))
        left -= first[-1]
    return first


class Stream:
    """A sharded source opened as rank `rank` of `world`: shards indexed, validation items held out, counts checked."""

    def __init__(self, shards: Shards, size: int, seed: int, rank: int, world: int, buffer: int, val_size: int,
                 caption_dropout: float = 0.0):
        self.shards, self.size, self.seed, self.rank, self.world, self.buffer = shards, size, seed, rank, world, buffer
        self.pick = CaptionPick(seed, caption_dropout)
        sizes, total = shards.sizes, sum(shards.sizes)
        if val_size >= total:
            raise ValueError(f"data.val_size={val_size} leaves no training images (the shards of {shards.where!r} "
                             f"hold {total} usable items); lower it")
        self.first = _holdout(sizes, val_size)
        self.starts = np.cumsum([0, *sizes[:-1]]).astype(np.int64)  # global number of each shard's item 0
        used = sum(n > f for n, f in zip(sizes, self.first))
        if used < world:
            held = f", once the {val_size} validation items are held out" if val_size else ""
            raise ValueError(
                f"{used} of the {len(sizes)} shards of {shards.where!r} hold training items{held}, fewer than the "
                f"{world} processes: each process reads its own shards. Write the data as more shards (at least "
                f"{world}, better many times that), or run at most {used} processes")

    @property
    def classes(self) -> list[str]:
        return self.shards.classes

    def __len__(self) -> int:
        """Training items over all shards (what every epoch of all ranks together covers)."""
        return sum(self.shards.sizes) - sum(self.first)

    def cursor(self) -> Cursor:
        return Cursor(self.first, self.shards.sizes, self.seed, self.rank, self.world, self.buffer)

    def validation(self) -> ImageDataset:
        """The held-out items, decoded in order (those that fail are left out, with a warning)."""
        items = [(s, i) for s, k in enumerate(self.first) for i in range(k)]
        pixels, labels, texts, failed = [], [], [], 0
        for s, i in items:
            try:
                pixels.append(_decode(self.shards, s, i, self.size))
                labels.append(int(self.shards.labels[s][i]))
                texts.append(self.shards.candidates[s][i] if self.shards.candidates is not None else [])
            except Exception as err:  # noqa: BLE001 - as for training items: skipped with the reason
                failed += 1
                logger.warning("validation item %s skipped: %s: %s", self.shards.item_name(s, i), type(err).__name__, err)
        images = torch.from_numpy(np.stack(pixels)) if pixels else torch.empty((0, 3, self.size, self.size), dtype=torch.uint8)
        table = None if self.shards.candidates is None else CaptionTable(texts)
        return ImageDataset(images, torch.tensor(labels, dtype=torch.int64), self.classes, candidates=table)

    def batches(self, per_step: int, workers: int) -> StreamBatches:
        """This rank's images, `per_step` per step, decoded by `workers` DataLoader workers (0: the caller)."""
        return StreamBatches(self, per_step, workers)


class _StepImages(torch.utils.data.Dataset):
    """Map-style over steps: item s is this rank's StepBatch of step s, its draws keyed (step, rank). Each process
    keeps its own cursor."""

    def __init__(self, stream: Stream, per_step: int):
        self.stream, self.per_step, self.cursor = stream, per_step, None

    def __getitem__(self, step: int) -> StepBatch:
        if self.cursor is None:
            self.cursor = self.stream.cursor()
        items = self.cursor.take(step * self.per_step, self.per_step)
        return decode_items(self.stream.shards, items, self.stream.starts, self.stream.size, (step, self.stream.rank),
                            self.stream.pick)


class _From(torch.utils.data.Sampler):
    """Steps start, start + 1, ... without end."""

    def __init__(self, start: int):
        self.start = start

    def __iter__(self) -> Iterator[int]:
        return itertools.count(self.start)


def _as_is(batch: StepBatch) -> StepBatch:
    return batch


def _one_thread(worker_id: int) -> None:
    torch.set_num_threads(1)  # workers decode with PIL; torch threads would only compete with the training process


class StreamBatches:
    """`get(step)` returns this rank's StepBatch of `step`; steps are asked in order (a jump restarts the workers).
    Items skipped are logged once each and counted in `skipped` (item -> why)."""

    def __init__(self, stream: Stream, per_step: int, workers: int):
        self.stream, self.per_step, self.workers = stream, per_step, workers
        self.it: Iterator[StepBatch] | None = None
        self.next_step: int | None = None
        self.skipped: dict[str, str] = {}

    def get(self, step: int) -> StepBatch:
        if step != self.next_step:
            self.close()
            loader = torch.utils.data.DataLoader(
                _StepImages(self.stream, self.per_step), batch_size=None, sampler=_From(step), num_workers=self.workers,
                collate_fn=_as_is, worker_init_fn=_one_thread, multiprocessing_context="fork" if self.workers else None,
            )
            self.it = iter(loader)
        batch = next(self.it)
        self.next_step = step + 1
        for name, why in batch.skipped:
            if name not in self.skipped:
                self.skipped[name] = why
                logger.warning("skipped %s: %s (its place in the step takes another image of the step)", name, why)
        return batch

    def close(self) -> None:
        self.it, self.next_step = None, None  # the iterator's end shuts its workers down


def stream_workers(num_workers: int | None) -> int:
    """DataLoader workers for `data.num_workers` decoding processes: 1 decodes in the training process (0 workers);
    None shares the cores among the processes of this machine (LOCAL_WORLD_SIZE, set by the launcher)."""
    if num_workers is None:
        num_workers = max(1, len(os.sched_getaffinity(0)) // int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    return 0 if num_workers <= 1 else num_workers


def open_stream(cfg: DataConfig, sample_size: int, seed: int, rank: int, world: int,
                caption_dropout: float = 0.0) -> Stream:
    """Rank `rank` of `world`'s stream of a data config (`data.streaming: true`) at the model's `sample_size`;
    captions, when the config asks for them, dropped with probability `caption_dropout`."""
    shards = open_shards(cfg)
    if shards.dropped and rank == 0:
        logger.warning("left out %d items without an image in %s (e.g. %s)", len(shards.dropped), shards.where,
                       shards.dropped[0][0])
    return Stream(shards, sample_size, seed, rank, world, cfg.shuffle_buffer, cfg.val_size, caption_dropout)

"""The one way in for training data: `open_training_data` gives this process its images of every step.

    data = open_training_data(cfg.data, sample_size, seed=cfg.train.seed, batch_size=cfg.train.batch_size,
                              accumulation=cfg.train.gradient_accumulation_steps, rank=rank, world=world,
                              caption_dropout=cfg.train.caption_dropout)
    batch = data.batch(step)      # StepBatch: ids, uint8 pixels, labels, captions (when data.caption_columns), draw rows
    data.validation               # the held-out images, in memory

Behind it, one of two ways, which the training loop never tells apart:
  - the prepared store (denoiser/data/store.py): the source, decoded once, memory-mapped by every process. Step s's
    global batch is `order.batch_indices(s)`; the batch is laid out [accumulation step][process][image] and this
    process takes its part, so P processes x A accumulation steps compute what one process computes, captions
    included (each picked by the step and its image's row, denoiser/data/captions.py);
  - a stream (`data.streaming: true`, denoiser/data/stream.py): each process reads its own shards.
"""

from __future__ import annotations

import logging

import torch

from denoiser.data.captions import CaptionPick
from denoiser.data.config import DataConfig
from denoiser.data.images import ImageDataset, StepBatch, split
from denoiser.data.order import batch_indices
from denoiser.data.sources import open_source
from denoiser.data.store import open_store, prepare_store
from denoiser.data.stream import Stream, StreamBatches, open_stream, stream_workers

__all__ = ["TrainingData", "open_training_data", "per_process_batch"]

logger = logging.getLogger(__name__)


def per_process_batch(batch_size: int, world: int, accumulation: int) -> int:
    """Images per process and accumulation step: train.batch_size split evenly, or an error saying what divides."""
    per_step = world * accumulation
    if batch_size % per_step:
        raise ValueError(
            f"train.batch_size={batch_size} must be divisible by processes x gradient_accumulation_steps "
            f"= {world} x {accumulation}; pick a multiple of {per_step}"
        )
    return batch_size // per_step


class TrainingData:
    """This process's training images of every step (`batch`), the validation set, the class names, and how many
    training images there are in all (`len`). `skipped`: items a stream could not decode (item -> why). `captioned`:
    the data carries text (data.caption_columns), so every StepBatch has captions."""

    validation: ImageDataset
    classes: list[str]
    streamed: bool = False
    captioned: bool = False
    skipped: dict[str, str]

    def __len__(self) -> int:
        raise NotImplementedError

    def batch(self, step: int) -> StepBatch:
        raise NotImplementedError

    def close(self) -> None:
        """Stop what reads ahead (a stream's DataLoader workers)."""

    def caption_texts(self) -> list[str]:
        """Every distinct caption text of the training images (the validation images' left out): the words a text
        model learns. Empty when the data carries no text."""
        raise NotImplementedError


class _StoreData(TrainingData):
    def __init__(self, train: ImageDataset, validation: ImageDataset, batch_size: int, seed: int, rank: int, world: int,
                 micro: int, caption_dropout: float = 0.0):
        self.train, self.validation, self.classes, self.skipped = train, validation, train.classes, {}
        self.batch_size, self.seed, self.pick = batch_size, seed, CaptionPick(seed, caption_dropout)
        self.captioned = train.candidates is not None
        accumulation = batch_size // (world * micro)
        # this process's positions in the global batch, laid out [accumulation step][process][image]
        self.rows = torch.cat([torch.arange(micro) + (a * world + rank) * micro for a in range(accumulation)])

    def __len__(self) -> int:
        return len(self.train)

    def batch(self, step: int) -> StepBatch:
        idx = batch_indices(len(self.train), self.batch_size, step, self.seed)[self.rows]
        captions = self.pick(self.train.candidates[idx], idx.tolist(), step) if self.captioned else None
        return StepBatch(idx, self.train.images[idx], self.train.labels[idx], (step,), self.batch_size, self.rows, captions)

    def caption_texts(self) -> list[str]:
        table = self.train.candidates
        if table is None:
            return []
        import pyarrow.compute as pc

        column = table.column if table.rows is None else table.column.take(table.rows.numpy())  # (N,) list<list<string>>
        return pc.unique(pc.list_flatten(pc.list_flatten(column))).to_pylist()


class _StreamData(TrainingData):
    streamed = True

    def __init__(self, stream: Stream, per_rank: int, workers: int):
        self.stream, self.classes, self.validation = stream, stream.classes, stream.validation()
        self.captioned = stream.shards.candidates is not None
        self.batches: StreamBatches = stream.batches(per_rank, workers)
        self.skipped = self.batches.skipped

    def __len__(self) -> int:
        return len(self.stream)

    def batch(self, step: int) -> StepBatch:
        return self.batches.get(step)

    def close(self) -> None:
        self.batches.close()

    def caption_texts(self) -> list[str]:
        shards, first = self.stream.shards, self.stream.first  # each shard's first `first[s]` items: validation
        if shards.candidates is None:
            return []
        return list({t for s, items in enumerate(shards.candidates) for groups in items[first[s]:] for g in groups for t in g})


def open_training_data(d: DataConfig, sample_size: int, *, seed: int, batch_size: int, accumulation: int = 1,
                       rank: int = 0, world: int = 1, caption_dropout: float = 0.0) -> TrainingData:
    """Process `rank` of `world`'s training data at the model's `sample_size`, for a global batch of `batch_size`
    images per optimizer step in `accumulation` parts, ordered by the run's `seed`: the store (prepared on first
    use: the first process on this machine or shared filesystem prepares it, the others wait), or a stream.
    Captions (data.caption_columns) are replaced by "" (no condition) with probability `caption_dropout`."""
    micro = per_process_batch(batch_size, world, accumulation)
    if d.streaming:
        stream = open_stream(d, sample_size, seed, rank, world, caption_dropout)
        if rank == 0:
            logger.info("data: a stream of %d items in %d shards of %s", len(stream), len(stream.shards.sizes), d.path)
        return _StreamData(stream, micro * accumulation, stream_workers(d.num_workers))
    info = prepare_store(open_source(d), sample_size, d.num_workers, progress=True)  # the preparer shows progress
    if rank == 0:
        logger.info("data: %d images from %s", info.num_images, info.path)
        if info.skipped:
            logger.warning("skipped %d of %d files: see %s", info.skipped, info.num_items, info.skipped_file)
    train, validation = split(open_store(info.path), d.val_size, d.val_seed)
    return _StoreData(train, validation, batch_size, seed, rank, world, micro, caption_dropout)

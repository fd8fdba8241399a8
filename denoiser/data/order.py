"""Which items go into optimizer step s: a pure function of (train.seed, s), and for a stream of its rank r.

Nothing here reads an image. Two orders, one per way in (denoiser/data/training.py):
  - the store: epochs are permutations of the training rows seeded by (seed, epoch); global step s takes batch
    s of them, the last partial batch of each epoch dropped (`batch_indices`);
  - a stream: rank r's endless sequence of descriptors (shard, item), through its shards of each epoch and a
    seeded shuffle buffer (`Cursor`, denoiser/data/stream.py tells the whole rule).

Every random stream of a run, here and in the training loop, comes from `seed_of(PURPOSE, seed, ...)`: the
first part names what the stream is for, so no two uses share numbers.
"""

from __future__ import annotations

import random

import numpy as np
import torch

__all__ = ["seed_of", "batch_indices", "buffer_order", "Cursor",
           "SHARD_ORDER", "SHUFFLE_BUFFER", "DRAWS", "STORE_EPOCH", "DROPOUT", "CAPTIONS", "NOISE"]

# What each seeded stream is for: the first part of its seed_of(...).
SHARD_ORDER = 1  # a stream's shards of epoch e: (seed, e)
SHUFFLE_BUFFER = 2  # a stream's shuffle buffer of epoch e on rank r: (seed, e, r)
DRAWS = 3  # timesteps, flips and label drops of a step's items (denoiser.train.command)
STORE_EPOCH = 4  # the store's permutation of epoch e: (seed, e)
DROPOUT = 5  # the torch seed of dropout at step s on rank r (denoiser.train.command)
CAPTIONS = 6  # the caption of image i at step s, and whether it is dropped: (seed, s), then i (denoiser/data/captions.py)
NOISE = 7  # the noise of a step's items, on the device that trains (denoiser.train.command): keyed as DRAWS


def seed_of(*parts: int) -> int:
    """A 64-bit seed mixing integers (numpy's SeedSequence): no two tuples of the same length collide in practice."""
    words = np.random.SeedSequence([p % (1 << 63) for p in parts]).generate_state(2, np.uint32)
    return int(words[0]) | int(words[1]) << 32


def batch_indices(num_images: int, batch_size: int, step: int, seed: int) -> torch.Tensor:
    """Rows of the global batch of optimizer step `step`: epochs are seeded permutations, last partial batch dropped."""
    per_epoch = num_images // batch_size
    if per_epoch == 0:
        raise ValueError(f"the training split has {num_images} images, fewer than one batch of {batch_size}: lower "
                         "train.batch_size (or data.val_size)")
    epoch, b = divmod(step, per_epoch)
    perm = torch.randperm(num_images, generator=torch.Generator().manual_seed(seed_of(STORE_EPOCH, seed, epoch)))
    return perm[b * batch_size : (b + 1) * batch_size]


def buffer_order(n: int, size: int, rng: random.Random) -> list[int]:
    """The order in which a shuffle buffer of `size` emits items 0..n-1 that arrive in order."""
    buf, out = [], []
    for i in range(n):
        if len(buf) < size:
            buf.append(i)
            continue
        j = rng.randrange(size)
        out.append(buf[j])
        buf[j] = i
    rng.shuffle(buf)  # the end of the epoch: what is left comes out shuffled
    return out + buf


class Cursor:
    """Rank r's endless stream of descriptors (shard, item); position p is its p-th item since step 0.

    `take` moves forward cheaply: whole epochs are skipped by their item count, and an epoch is laid out (its
    shards' descriptors through the buffer) only when a taken position falls into it."""

    def __init__(self, first: list[int], sizes: list[int], seed: int, rank: int, world: int, buffer: int):
        self.first, self.sizes, self.seed, self.rank, self.world, self.buffer = first, sizes, seed, rank, world, buffer
        self.nonempty = [s for s in range(len(sizes)) if sizes[s] > first[s]]
        self._rewind()

    def _rewind(self) -> None:
        self.epoch, self.epoch_start, self.items = 0, 0, None
        self.length = self._length(0)

    def epoch_shards(self, epoch: int) -> list[int]:
        """This rank's shards in epoch `epoch`: every W-th of a permutation seeded by (seed, epoch)."""
        order = list(self.nonempty)
        random.Random(seed_of(SHARD_ORDER, self.seed, epoch)).shuffle(order)
        return order[self.rank :: self.world]

    def _length(self, epoch: int) -> int:
        return sum(self.sizes[s] - self.first[s] for s in self.epoch_shards(epoch))

    def _layout(self, epoch: int) -> np.ndarray:
        """Epoch `epoch`'s descriptors in the order they leave the buffer, (L, 2): shard, item."""
        arrived = np.concatenate([
            np.stack([np.full(self.sizes[s] - self.first[s], s), np.arange(self.first[s], self.sizes[s])], 1)
            for s in self.epoch_shards(epoch)
        ])  # (L, 2) in shard order, each shard in stored order
        rng = random.Random(seed_of(SHUFFLE_BUFFER, self.seed, epoch, self.rank))
        return arrived[buffer_order(len(arrived), self.buffer, rng)]

    def take(self, start: int, count: int) -> np.ndarray:
        """Descriptors at positions [start, start + count), (count, 2)."""
        if start < self.epoch_start:
            self._rewind()
        out, pos = [], start
        while count > 0:
            if pos >= self.epoch_start + self.length:  # past this epoch: skip it whole
                self.epoch_start += self.length
                self.epoch += 1
                self.items, self.length = None, self._length(self.epoch)
                continue
            if self.items is None:
                self.items = self._layout(self.epoch)
            a = pos - self.epoch_start
            chunk = self.items[a : a + count]
            out.append(chunk)
            pos, count = pos + len(chunk), count - len(chunk)
        return np.concatenate(out) if out else np.empty((0, 2), dtype=np.int64)

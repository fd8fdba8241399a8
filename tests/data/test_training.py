"""The one way in for training data (denoiser/data/training.py, the table of sources in denoiser/data/sources.py): a
source registered in one row is read by the store and the stream alike; the store's per-process parts tile the
global batch; the training loop knows neither way."""

from __future__ import annotations

import ast

import numpy as np
import pytest
import torch

from denoiser.data import SOURCES, open_training_data
from denoiser.data.base import Chunk, Shards, Source
from denoiser.data.order import batch_indices
from denoiser.data.sources import SourceKind
from denoiser.train.config import config_from_dict
from tests.conftest import ROOT, TRAIN_CONFIG

N, S = 40, TRAIN_CONFIG["model"]["sample_size"]  # items of the made-up source, image size


def _pixels(i: int) -> np.ndarray:
    """Item i's image: a flat colour that encodes i, so every image can be told apart."""
    return np.full((3, S, S), i * 5, dtype=np.uint8)


class _Counted(Source):
    """A new kind of source: N flat images, labelled i % 3."""

    name, classes = "counted", ["a", "b", "c"]

    def __len__(self) -> int:
        return N

    def fingerprint(self) -> str:
        return f"counted-{N}"

    def read(self, start: int, stop: int, size: int) -> Chunk:
        return Chunk(np.stack([_pixels(i) for i in range(start, stop)]), np.arange(start, stop) % 3)


class _CountedShards(Shards):
    """The same N items as 4 shards of 10 (each encoded as a PNG, as a tar member or a parquet cell would be)."""

    def __init__(self):
        self.where, self.classes, self.dropped = "counted", ["a", "b", "c"], []
        self.sizes = [10] * 4
        self.labels = [np.arange(10 * s, 10 * s + 10) % 3 for s in range(4)]

    def encoded(self, shard: int, item: int) -> bytes:
        import io

        from PIL import Image

        buf = io.BytesIO()
        Image.fromarray(_pixels(10 * shard + item).transpose(1, 2, 0)).save(buf, format="PNG")  # (3,S,S) -> (S,S,3)
        return buf.getvalue()

    def item_name(self, shard: int, item: int) -> str:
        return f"counted {shard}/{item}"


@pytest.fixture
def counted(monkeypatch):
    monkeypatch.setitem(SOURCES, "counted", SourceKind(lambda cfg: _Counted(), lambda cfg: _CountedShards(), needs_path=False))


def _run_cfg(**data):
    return config_from_dict({"model": TRAIN_CONFIG["model"],
                             "data": {"dataset": "counted", "val_size": 4, "random_flip": False, **data},
                             "train": {"batch_size": 8, "seed": 3}})


def _open(cfg, rank: int = 0, world: int = 1):
    t = cfg.train
    return open_training_data(cfg.data, S, seed=t.seed, batch_size=t.batch_size, accumulation=t.gradient_accumulation_steps,
                              rank=rank, world=world)


@pytest.mark.parametrize("streaming", [False, True])
def test_a_source_registered_in_one_row_is_read_by_the_store_and_the_stream(counted, streaming):
    data = _open(_run_cfg(streaming=streaming, num_workers=1))
    try:
        assert data.classes == ["a", "b", "c"] and data.streamed == streaming
        assert len(data) == N - 4 and len(data.validation) == 4
        for step in range(3):
            batch = data.batch(step)
            assert batch.pixels.shape == (8, 3, S, S) and batch.pixels.dtype == torch.uint8
            item = batch.pixels[:, 0, 0, 0].long() // 5  # the item each image encodes
            assert torch.equal(batch.labels, item % 3)  # labels travel with their images
            assert batch.captions is None and batch.draw_size == len(batch.draw_rows) >= 8
        val_items = set((data.validation.images[:, 0, 0, 0].long() // 5).tolist())
        seen = set()
        for step in range(10):
            seen |= set((data.batch(step).pixels[:, 0, 0, 0].long() // 5).tolist())
        assert not seen & val_items  # never trained on what is held out
    finally:
        data.close()


def test_an_unknown_source_is_refused_with_the_table_of_names():
    with pytest.raises(ValueError, match="data.dataset must be one of synthetic, folder, hf, webdataset, cifar10"):
        _run_cfg()  # "counted" is not registered here


@pytest.mark.parametrize("world,accumulation", [(2, 1), (2, 2), (4, 1)])
def test_the_stores_process_parts_tile_the_global_batch(counted, world, accumulation):
    cfg = _run_cfg()
    cfg.train.gradient_accumulation_steps = accumulation
    parts = [_open(cfg, rank, world) for rank in range(world)]
    micro = 8 // (world * accumulation)
    for step in (0, 5):
        whole = batch_indices(N - 4, 8, step, seed=3)
        rebuilt = torch.empty(8, dtype=torch.long)
        for rank, data in enumerate(parts):
            batch = data.batch(step)
            assert batch.draw_key == (step,) and batch.draw_size == 8  # every process draws for the whole batch
            rebuilt[batch.draw_rows] = batch.ids
            # in [accumulation step][image] order: rank r's images of accumulation step a sit at (a * world + r) * micro
            for a in range(accumulation):
                first = (a * world + rank) * micro
                assert torch.equal(batch.ids[a * micro : (a + 1) * micro], whole[first : first + micro])
        assert torch.equal(rebuilt, whole)


def test_a_bad_split_over_processes_is_refused_before_any_data_is_read(counted):
    cfg = _run_cfg()
    cfg.train.gradient_accumulation_steps = 3
    with pytest.raises(ValueError, match="divisible by processes x gradient_accumulation_steps = 1 x 3"):
        _open(cfg)


def test_the_training_loop_knows_one_way_in():
    tree = ast.parse((ROOT / "denoiser" / "train" / "command.py").read_text())
    imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert "denoiser.data.stream" not in imported and "denoiser.data.store" not in imported


def test_a_split_smaller_than_one_batch_is_refused_with_the_fix():
    with pytest.raises(ValueError, match="fewer than one batch of 8: lower train.batch_size"):
        batch_indices(5, 8, step=0, seed=0)

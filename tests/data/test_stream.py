"""Streaming shards (denoiser/data/stream.py): each rank's own shards, a seeded order, worker-independent decoding,
the resume guarantee (descriptor replay, and a training run stopped and resumed), Hugging Face files, bad configs."""

from __future__ import annotations

import io
import json
import random
import tarfile

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors.torch import load_file

from denoiser.data.decode import decode_image
from denoiser.data.order import Cursor, buffer_order
from denoiser.data.sources import open_shards
from denoiser.data.stream import Stream, open_stream
from denoiser.train.config import DataConfig, config_from_dict
from tests.conftest import TRAIN_CONFIG, write_config

COUNTS = (5, 4, 6, 3, 4)  # samples per shard: unequal on purpose
NAMES = ("cat", "dog", "owl")  # sample i's .cls member holds NAMES[i % 3]


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def write_shards(root, counts=COUNTS) -> tuple[str, dict[str, bytes]]:
    """Tar shards of small JPEGs and PNGs with .cls class names; shard 1's third image is broken and shard 2 holds a sample
    without an image. Returns (brace pattern, encoded image of every sample key)."""
    root.mkdir(parents=True, exist_ok=True)
    encoded, i = {}, 0
    for s, n in enumerate(counts):
        with tarfile.open(root / f"{s:03d}.tar", "w") as tar:
            for j in range(n):
                buf = io.BytesIO()
                Image.new("RGB", (12 + i % 5, 10), (13 * i % 256, 200 - 7 * i, 40 + 3 * j)).save(buf, format="PNG" if i % 2 else "JPEG")
                data = b"not an image at all" if (s, j) == (1, 2) else buf.getvalue()
                encoded[f"s{i:04d}"] = data
                _add(tar, f"s{i:04d}.{'png' if i % 2 else 'jpg'}", data)
                _add(tar, f"s{i:04d}.cls", NAMES[i % 3].encode())
                i += 1
            if s == 2:
                _add(tar, "lonely.cls", b"dog")
    return str(root / f"{{000..{len(counts) - 1:03d}}}.tar"), encoded


def _decoded(data: bytes) -> torch.Tensor:
    return torch.from_numpy(decode_image(data, 8).copy())  # (3, 8, 8) uint8, as the stream decodes it


@pytest.fixture
def shards(tmp_path):
    return write_shards(tmp_path / "shards")


def _cfg(pattern: str, **kw) -> DataConfig:
    return DataConfig(dataset="webdataset", path=pattern, streaming=True, **{"val_size": 3, "shuffle_buffer": 4, **kw})


def test_buffer_order_is_a_seeded_permutation():
    out = buffer_order(50, 8, random.Random(0))
    assert sorted(out) == list(range(50)) and out != list(range(50))
    assert out == buffer_order(50, 8, random.Random(0)) and out != buffer_order(50, 8, random.Random(1))
    assert buffer_order(20, 1, random.Random(0)) == list(range(20))  # a buffer of one keeps the arrival order
    assert max(abs(p - i) for i, p in enumerate(buffer_order(200, 4, random.Random(0)))) < 200  # local shuffling


def test_each_rank_reads_its_own_shards_and_the_order_follows_the_seed():
    sizes, first = [5, 4, 6, 3, 4, 0], [3, 0, 0, 0, 0, 0]  # shard 5 is empty: never handed out
    for world in (1, 2, 3):
        for epoch in range(4):
            per_rank = [Cursor(first, sizes, 7, r, world, 4).epoch_shards(epoch) for r in range(world)]
            flat = [s for shards in per_rank for s in shards]
            assert sorted(flat) == [0, 1, 2, 3, 4], (world, epoch)  # disjoint, and together every shard
    orders = {tuple(Cursor(first, sizes, seed, 0, 2, 4).epoch_shards(e)) for seed in (7, 8) for e in range(3)}
    assert len(orders) > 1  # the split changes with the seed and the epoch
    # one epoch of rank r is exactly the training items of its shards, each once
    cursor = Cursor(first, sizes, 7, 1, 2, 4)
    want = sorted((s, i) for s in cursor.epoch_shards(0) for i in range(first[s], sizes[s]))
    got = cursor.take(0, len(want))
    assert sorted(map(tuple, got.tolist())) == want
    assert got.tolist() == Cursor(first, sizes, 7, 1, 2, 4).take(0, len(want)).tolist()  # a function of the seed
    assert got.tolist() != Cursor(first, sizes, 8, 1, 2, 4).take(0, len(want)).tolist()


def test_replaying_descriptors_gives_the_uninterrupted_steps():
    sizes, first, n = [5, 4, 6, 3, 4], [3, 0, 0, 0, 0], 3
    straight = Cursor(first, sizes, 0, 1, 2, 4)
    steps = [straight.take(k * n, n) for k in range(12)]  # several epochs of rank 1
    for k in (0, 3, 7, 11):
        resumed = Cursor(first, sizes, 0, 1, 2, 4)
        assert np.array_equal(resumed.take(k * n, n), steps[k]), k  # a fresh cursor skips straight to step k
    assert np.array_equal(straight.take(2 * n, n), steps[2])  # going back rewinds


def test_batches_do_not_depend_on_workers_or_where_the_run_resumed(shards):
    pattern, _ = shards
    stream = open_stream(_cfg(pattern), 8, seed=0, rank=1, world=2)
    one = stream.batches(3, workers=0)
    straight = [one.get(k) for k in range(6)]  # past the end of rank 1's first epoch
    two = stream.batches(3, workers=2)
    try:
        resumed = [two.get(k) for k in range(2, 6)]  # a resume at step 2, decoded by two worker processes
    finally:
        one.close()
        two.close()
    for a, b in zip(straight[2:], resumed):
        assert torch.equal(a.ids, b.ids) and torch.equal(a.pixels, b.pixels) and torch.equal(a.labels, b.labels)
    assert all(b.pixels.shape == (3, 3, 8, 8) and b.pixels.dtype == torch.uint8 for b in straight)


def test_broken_items_are_skipped_counted_and_replaced_within_their_step(shards):
    pattern, encoded = shards
    stream = open_stream(_cfg(pattern, val_size=0, shuffle_buffer=1), 8, seed=0, rank=0, world=1)
    assert stream.shards.dropped == [("002.tar/lonely", "the sample has no image member")]
    assert len(stream) == sum(COUNTS) and stream.classes == list(NAMES)
    batches = stream.batches(sum(COUNTS), workers=0)
    batch = batches.get(0)  # one epoch: every item once, in its shards' order (a buffer of one)
    batches.close()
    assert list(batches.skipped) == ["001.tar/s0007"] and "UnidentifiedImageError" in batches.skipped["001.tar/s0007"]
    ids = batch.ids.tolist()
    at = ids.index(8)  # s0007 is global item 7; its place took the next decodable item of the step, s0008
    assert 7 not in ids and ids[at + 1] == 8 and torch.equal(batch.pixels[at], batch.pixels[at + 1])
    want = _decoded(encoded["s0008"])
    assert torch.equal(batch.pixels[at], want) and batch.labels[at].item() == 8 % 3


def test_validation_is_the_first_items_and_never_trained_on(shards):
    pattern, encoded = shards
    stream = open_stream(_cfg(pattern, val_size=6, shuffle_buffer=1), 8, seed=0, rank=0, world=1)
    val = stream.validation()  # the first 6 in listed order: shard 0's five, then shard 1's first
    ref = torch.stack([_decoded(encoded[f"s{i:04d}"]) for i in range(6)])
    assert torch.equal(val.images, ref) and val.labels.tolist() == [i % 3 for i in range(6)]
    seen = stream.cursor().take(0, 4 * len(stream))
    assert len(stream) == sum(COUNTS) - 6 and not any(s == 0 or (s, i) == (1, 0) for s, i in seen.tolist())


def test_hugging_face_files_stream_with_class_names(tmp_path):
    import datasets

    encoded = []
    for i in range(7):
        buf = io.BytesIO()
        Image.new("RGB", (11, 9 + i), (30 * i, 100, 200 - 20 * i)).save(buf, format="PNG")
        encoded.append(buf.getvalue())
    feats = datasets.Features({"img": datasets.Image(), "y": datasets.ClassLabel(names=["cat", "dog", "owl"])})
    ds = datasets.Dataset.from_dict({"img": [{"bytes": b, "path": None} for b in encoded], "y": [i % 3 for i in range(7)]},
                                    features=feats)
    ds.save_to_disk(str(tmp_path / "saved"), num_shards=2)
    (tmp_path / "pq").mkdir()
    ds.select(range(4)).to_parquet(str(tmp_path / "pq" / "a.parquet"))
    ds.select(range(4, 7)).to_parquet(str(tmp_path / "pq" / "b.parquet"))
    for folder in ("saved", "pq"):
        cfg = DataConfig(dataset="hf", path=str(tmp_path / folder), image_column="img", label_column="y", streaming=True)
        shards = open_shards(cfg)
        assert shards.classes == ["cat", "dog", "owl"] and sum(shards.sizes) == 7 and len(shards.sizes) == 2, folder
        stream = Stream(shards, 8, seed=0, rank=0, world=2, buffer=3, val_size=0)
        items = stream.cursor().take(0, 40)  # a few epochs of rank 0
        batch = stream.batches(40, workers=0).get(0)
        for (s, i), ids, pixels, label in zip(items.tolist(), batch.ids, batch.pixels, batch.labels):
            row = int(stream.starts[s]) + i
            assert ids.item() == row and label.item() == row % 3, folder
            assert torch.equal(pixels, _decoded(encoded[row])), folder


def test_bad_stream_configs_say_what_to_do(shards, tmp_path):
    pattern, _ = shards
    with pytest.raises(ValueError, match=r"5 of the 5 shards .* fewer than the 6 processes.*more shards.*at most 5"):
        open_stream(_cfg(pattern, val_size=0), 8, seed=0, rank=0, world=6)
    with pytest.raises(ValueError, match="4 of the 5 shards .* once the 5 validation items are held out"):
        open_stream(_cfg(pattern, val_size=5), 8, seed=0, rank=0, world=5)
    with pytest.raises(ValueError, match="data.streaming needs sharded data.*got 'folder'.*remove data.streaming"):
        config_from_dict({**TRAIN_CONFIG, "data": {"dataset": "folder", "path": str(tmp_path), "streaming": True}})
    with pytest.raises(ValueError, match="there is no store to prepare"):
        from denoiser.data import prepare

        prepare(_cfg(pattern), 8)


@pytest.fixture
def in_process():
    """Training runs in this process (a subprocess each would spend most of the test importing); Accelerate's
    process-wide state is reset afterwards for the tests that follow."""
    from accelerate.state import AcceleratorState

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as `cli` runs them (OMP_NUM_THREADS=1): a tiny model only loses to thread hand-offs
    yield
    torch.set_num_threads(threads)
    AcceleratorState._reset_state(reset_partial_state=True)


def test_a_stream_run_stopped_and_resumed_ends_with_the_uninterrupted_weights(shards, tmp_path, in_process):
    from denoiser.train.config import load_config
    from denoiser.train.loop import train

    pattern, _ = shards
    data = {"dataset": "webdataset", "path": pattern, "streaming": True, "shuffle_buffer": 4, "val_size": 2}
    sections = {"train": {"batch_size": 4, "max_steps": 4, "checkpoint_every": 2}, "model": {"num_class_embeds": 3}}
    straight = write_config(tmp_path / "a.yaml", data={**data, "num_workers": 1}, **sections)  # decoded in this process
    split = write_config(tmp_path / "b.yaml", data={**data, "num_workers": 2}, **sections)  # by two DataLoader workers
    train(load_config(straight), tmp_path / "straight")
    train(load_config(split, ["train.max_steps=2"]), tmp_path / "split")  # stops at step 2, as a killed run would
    train(load_config(split), tmp_path / "split", resume="latest")
    for name in ("model.safetensors", "ema.safetensors"):
        a = load_file(str(tmp_path / "straight" / "checkpoints" / "checkpoint-00000004" / name))
        b = load_file(str(tmp_path / "split" / "checkpoints" / "checkpoint-00000004" / name))
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), name
    summary = json.loads((tmp_path / "split" / "train_summary.json").read_text())
    assert summary["validation_images"] == 2 and summary["per_rank"][0]["images"] == 2 * 4  # this sitting's 2 steps
    assert summary["per_rank"][0]["skipped"] in (0, 1)  # the broken sample, if this sitting met it
    assert (tmp_path / "split" / "model" / "classes.txt").read_text().split() == list(NAMES)

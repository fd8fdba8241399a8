"""Datasets: the synthetic set, real folders (broken files, EXIF, modes, layouts), the prepared store, HF datasets."""

from __future__ import annotations

import io
import json
import subprocess
import sys

import numpy as np
import pytest
import torch
from PIL import Image

from denoiser.data import (
    MappedImages,
    load_dataset,
    load_datasets,
    make_synthetic,
    prepare,
    split,
)
from denoiser.data.decode import decode_image
from denoiser.train.config import DataConfig
from tests.conftest import ROOT, photo_folder


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    """Every test prepares its stores in its own cache folder."""
    monkeypatch.setenv("DENOISER_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_synthetic_is_deterministic_labelled_and_in_range():
    a, b = make_synthetic(40, 16, seed=3), make_synthetic(40, 16, seed=3)
    assert torch.equal(a.images, b.images) and torch.equal(a.labels, b.labels)
    assert not torch.equal(a.images, make_synthetic(40, 16, seed=4).images)
    x, y = a.batch(torch.arange(8))
    assert x.shape == (8, 3, 16, 16) and x.min() >= -1 and x.max() <= 1
    assert set(a.labels.tolist()) <= set(range(len(a.classes))) and len(set(a.labels.tolist())) > 1
    # shapes are crisp: most pixels are exactly background or foreground, images are not flat
    assert (a.images.float().flatten(1).std(1) > 5).all()


def _write(root, name=None, mode="RGB", size=(20, 12), colour=None):
    path = root if name is None else root / name
    path.parent.mkdir(parents=True, exist_ok=True)
    fill = colour if colour is not None else (128 if mode in ("L", "P") else (200, 10, 10, 255)[: len(mode)])
    Image.new(mode, size, fill).save(path)
    return path


def test_folder_converts_modes_resizes_and_labels(tmp_path):
    _write(tmp_path / "cats" / "a.png", mode="RGB")
    _write(tmp_path / "cats" / "b.png", mode="L")
    _write(tmp_path / "dogs" / "c.png", mode="RGBA", size=(9, 30))
    _write(tmp_path / "dogs" / "d.jpg", mode="CMYK", colour=(0, 255, 255, 0))  # CMYK red
    _write(tmp_path / "dogs" / "e.png", mode="P")
    Image.fromarray(np.full((10, 10), 0x8000, dtype=np.uint16)).save(tmp_path / "dogs" / "f.png")  # 16-bit grey
    ds = load_dataset(DataConfig(dataset="folder", path=str(tmp_path)), 8)
    assert ds.images.shape == (6, 3, 8, 8) and ds.images.dtype == torch.uint8
    assert ds.classes == ["cats", "dogs"] and ds.labels.tolist() == [0, 0, 1, 1, 1, 1]
    px = ds.images[torch.arange(6)][:, :, 4, 4]  # centre pixels (6, 3)
    assert px[2].tolist() == [200, 10, 10]  # opaque RGBA keeps its colour
    assert px[3, 0] > 200 and px[3, 1] < 60 and px[3, 2] < 60  # CMYK red is red
    assert px[5].tolist() == [128, 128, 128]  # 16-bit 0x8000 -> its top byte, not clipped to white


def test_exif_orientation_is_applied(tmp_path):
    stored = np.zeros((20, 40, 3), dtype=np.uint8)  # stored landscape: left half red, right half blue
    stored[:, :20, 0], stored[:, 20:, 2] = 255, 255
    exif = Image.Exif()
    exif[0x0112] = 6  # "rotate 90 clockwise to display": the red half ends up on top
    Image.fromarray(stored).save(tmp_path / "rotated.jpg", exif=exif, quality=95)
    img = decode_image(tmp_path / "rotated.jpg", 8)  # (3, 8, 8): the portrait's centre square
    assert img.shape == (3, 8, 8)
    assert img[0, 0].mean() > 200 and img[2, 0].mean() < 50  # top row red
    assert img[2, -1].mean() > 200 and img[0, -1].mean() < 50  # bottom row blue


def test_jpeg_draft_decoding_matches_a_full_decode(tmp_path):
    rng = np.random.default_rng(1)
    smooth = np.kron(rng.integers(0, 256, (12, 16, 3)), np.ones((64, 64, 1))).astype(np.uint8)  # 768 x 1024
    Image.fromarray(smooth).save(tmp_path / "big.jpg", quality=95)
    from denoiser.image_io import fit_to_size

    full = np.asarray(fit_to_size(32)(Image.open(tmp_path / "big.jpg").convert("RGB"))).transpose(2, 0, 1)
    fast = decode_image(tmp_path / "big.jpg", 32)
    assert np.abs(full.astype(int) - fast.astype(int)).mean() < 3  # DCT scaling vs decode-and-downscale


def test_broken_files_are_skipped_counted_and_listed(tmp_path):
    photo_folder(tmp_path / "photos")
    good = (tmp_path / "photos" / "cats" / "001.jpg").read_bytes()
    (tmp_path / "photos" / "cats" / "truncated.jpg").write_bytes(good[: len(good) // 2])
    (tmp_path / "photos" / "dogs" / "broken.png").write_bytes(b"not a png at all")
    (tmp_path / "photos" / "dogs" / "notes.txt").write_text("hello")
    info = prepare(DataConfig(dataset="folder", path=str(tmp_path / "photos")), 8)
    assert (info.num_items, info.num_images, info.skipped) == (9, 6, 3)
    listed = info.skipped_file.read_text()
    for name in ("truncated.jpg", "broken.png", "notes.txt"):
        assert name in listed
    train, val = load_datasets(DataConfig(dataset="folder", path=str(tmp_path / "photos"), val_size=2), 8)
    assert len(train) + len(val) == 6


def test_folder_errors_name_the_problem(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_dataset(DataConfig(dataset="folder", path=str(tmp_path / "missing")), 8)
    (tmp_path / "empty" / "cls").mkdir(parents=True)
    with pytest.raises(ValueError, match="no images found"):
        load_dataset(DataConfig(dataset="folder", path=str(tmp_path / "empty")), 8)
    bad = tmp_path / "bad" / "cls"
    bad.mkdir(parents=True)
    (bad / "broken.png").write_bytes(b"not a png at all")
    with pytest.raises(ValueError, match="no usable images.*broken.png"):
        load_dataset(DataConfig(dataset="folder", path=str(tmp_path / "bad")), 8)


def test_flat_folder_is_unconditional_and_metadata_gives_labels(tmp_path):
    for i in range(3):
        _write(tmp_path / "flat" / f"{i}.png", colour=(10 * i, 0, 0))
    flat = load_dataset(DataConfig(dataset="folder", path=str(tmp_path / "flat")), 8)
    assert len(flat) == 3 and flat.classes == [] and flat.labels.tolist() == [0, 0, 0]
    meta = tmp_path / "meta"
    for i, name in enumerate(["b.png", "sub/a.png", "c.png"]):
        _write(meta / name, colour=(0, 50 * i, 0))
    (meta / "metadata.csv").write_text("file_name,label\nb.png,zebra\nsub/a.png,ant\nc.png,zebra\n")
    ds = load_dataset(DataConfig(dataset="folder", path=str(meta)), 8)
    assert ds.classes == ["ant", "zebra"] and ds.labels.tolist() == [1, 0, 1]
    assert ds.images[1][1, 4, 4].item() == 50  # rows in metadata order: sub/a.png is the second
    (meta / "metadata.csv").unlink()
    (meta / "metadata.jsonl").write_text("".join(json.dumps({"file_name": n}) + "\n" for n in ("c.png", "b.png")))
    unlabelled = load_dataset(DataConfig(dataset="folder", path=str(meta)), 8)
    assert len(unlabelled) == 2 and unlabelled.classes == []


def test_store_is_memory_mapped_reused_and_keyed_by_content_and_size(tmp_path, monkeypatch):
    photo_folder(tmp_path / "photos")
    cfg = DataConfig(dataset="folder", path=str(tmp_path / "photos"), val_size=2)
    first = prepare(cfg, 8)
    ds = load_dataset(DataConfig(dataset="folder", path=str(tmp_path / "photos")), 8)
    assert isinstance(ds.images, MappedImages) and ds.store == first.path
    # the store holds exactly what decoding each file gives, in ImageFolder order
    files = sorted((tmp_path / "photos").glob("cats/*.jpg")) + sorted((tmp_path / "photos").glob("dogs/*.jpg"))
    ref = torch.stack([torch.from_numpy(decode_image(f, 8)) for f in files])
    assert torch.equal(ds.images[torch.arange(6)], ref) and torch.equal(ds.images[2:4], ref[2:4])
    # a second run decodes nothing
    import denoiser.data.folder as sources

    monkeypatch.setattr(sources, "decode_image", lambda *a: (_ for _ in ()).throw(AssertionError("decoded again")))
    assert prepare(cfg, 8).path == first.path
    monkeypatch.undo()
    monkeypatch.setenv("DENOISER_CACHE", str(tmp_path / "cache"))
    assert prepare(cfg, 16).path != first.path  # another size
    _write(tmp_path / "photos" / "cats" / "new.png")
    changed = prepare(cfg, 8)
    assert changed.path != first.path and changed.num_images == 7  # a file added: prepared again
    (tmp_path / "photos" / "cats" / "new.png").write_bytes((tmp_path / "photos" / "cats" / "001.jpg").read_bytes())
    assert prepare(cfg, 8).path not in (first.path, changed.path)  # a file modified


def test_parallel_preparation_gives_the_same_store(tmp_path):
    photo_folder(tmp_path / "photos", n=10)
    one = load_dataset(DataConfig(dataset="folder", path=str(tmp_path / "photos")), 8)
    two = load_dataset_with_workers(tmp_path / "photos", 2, tmp_path / "other-cache")
    assert torch.equal(one.images[torch.arange(10)], two.images[torch.arange(10)])
    assert torch.equal(one.labels, two.labels)


def load_dataset_with_workers(path, workers, cache, monkeypatch=None):
    import os

    from denoiser.data import load_dataset

    old = os.environ["DENOISER_CACHE"]
    os.environ["DENOISER_CACHE"] = str(cache)
    try:
        return load_dataset(DataConfig(dataset="folder", path=str(path), num_workers=workers), 8)
    finally:
        os.environ["DENOISER_CACHE"] = old


PREPARER = """
import sys, time
import denoiser.data.folder as sources
import denoiser.data.store as store
from denoiser.train.config import DataConfig
slow = sources.decode_image
sources.decode_image = lambda *a: (time.sleep(0.05), slow(*a))[1]
real = store._prepare
store._prepare = lambda *a: (print("PREPARED", flush=True), real(*a))
info = store.prepare_store(sources.list_folder(sys.argv[1]), 8, num_workers=1, progress=False)
print(info.path, info.num_images)
"""


def test_concurrent_preparers_prepare_once(tmp_path, cache):
    photo_folder(tmp_path / "photos", n=20)
    procs = [subprocess.Popen([sys.executable, "-c", PREPARER, str(tmp_path / "photos")], cwd=ROOT,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(3)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), [e for _, e in outs]
    assert sum(o.count("PREPARED") for o, _ in outs) == 1  # one prepared, the others waited and opened it
    results = {o.strip().splitlines()[-1] for o, _ in outs}
    assert len(results) == 1 and results.pop().endswith(" 20")
    assert not list((cache / "data").glob(".*.tmp-*"))


def test_validation_split_is_deterministic_and_disjoint():
    ds = make_synthetic(50, 8)
    tr1, va1 = split(ds, 10, seed=0)
    tr2, va2 = split(ds, 10, seed=0)
    assert torch.equal(va1.images, va2.images) and len(tr1) == 40 and len(va1) == 10
    _, va3 = split(ds, 10, seed=1)
    assert not torch.equal(va1.images, va3.images)
    with pytest.raises(ValueError, match="leaves no training images"):
        split(ds, 50, 0)


def test_load_datasets_from_config_maps_the_same_images_as_in_memory():
    train, val = load_datasets(DataConfig(num_images=30, val_size=5), 8)
    assert len(train) == 25 and len(val) == 5 and train.images.shape[-1] == 8
    assert isinstance(train.images, MappedImages) and isinstance(val.images, torch.Tensor)
    ref_train, ref_val = split(make_synthetic(30, 8), 5, 0)
    assert torch.equal(train.images[torch.arange(25)], ref_train.images) and torch.equal(val.images, ref_val.images)
    assert torch.equal(train.labels, ref_train.labels) and train.classes == ref_train.classes


def _hf_dataset(tmp_path, labels=("cat", "dog")):
    """A `datasets` set with an Image column (PNG bytes) and a ClassLabel, and the images as a folder too."""
    import datasets

    images, rows = [], []
    for i in range(5):
        img = Image.new("RGB", (12 + i, 10), (40 * i, 255 - 40 * i, 7))
        buf = io.BytesIO()
        img.save(buf, format="PNG")
        images.append(buf.getvalue())
        rows.append(i % 2)
    feats = datasets.Features({"img": datasets.Image(), "y": datasets.ClassLabel(names=list(labels))})
    return datasets.Dataset.from_dict({"img": [{"bytes": b, "path": None} for b in images], "y": rows}, features=feats), images


def test_hf_save_to_disk_and_parquet_folders(tmp_path):
    ds, encoded = _hf_dataset(tmp_path)
    ds.save_to_disk(str(tmp_path / "saved"))
    (tmp_path / "pq").mkdir()
    ds.to_parquet(str(tmp_path / "pq" / "train-00000.parquet"))
    ref = torch.stack([torch.from_numpy(decode_image(b, 8)) for b in encoded])
    for folder in ("saved", "pq"):
        cfg = DataConfig(dataset="hf", path=str(tmp_path / folder), image_column="img", label_column="y")
        from denoiser.data import load_dataset

        got = load_dataset(cfg, 8)
        assert got.classes == ["cat", "dog"] and got.labels.tolist() == [0, 1, 0, 1, 0], folder
        assert torch.equal(got.images[torch.arange(5)], ref), folder
    with pytest.raises(ValueError, match="no column 'image'.*set data.image_column"):
        load_dataset(DataConfig(dataset="hf", path=str(tmp_path / "saved")), 8)


def test_hf_string_labels_and_no_labels(tmp_path):
    import datasets

    from denoiser.data import load_dataset

    ds, _ = _hf_dataset(tmp_path)
    plain = ds.cast_column("y", datasets.Value("int64")).map(lambda r: {"name": ["b", "a", "c", "a", "b"][r["y"] + 0]})
    plain = plain.remove_columns("y").rename_column("img", "image")
    plain.save_to_disk(str(tmp_path / "named"))
    named = load_dataset(DataConfig(dataset="hf", path=str(tmp_path / "named"), label_column="name"), 8)
    assert named.classes == ["a", "b"] and len(named) == 5
    none = load_dataset(DataConfig(dataset="hf", path=str(tmp_path / "named"), label_column=None), 8)
    assert none.classes == [] and none.labels.tolist() == [0] * 5


def _write_cifar10(root, per_batch=6):
    """A miniature cifar-10-batches-py: the official layout and keys, random pixels."""
    import pickle

    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        batch = {"data": rng.integers(0, 256, (per_batch, 3072), dtype=np.uint8),
                 "labels": rng.integers(0, 10, per_batch).tolist()}
        (folder / name).write_bytes(pickle.dumps(batch))
    names = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
    (folder / "batches.meta").write_bytes(pickle.dumps({"label_names": names}))
    return folder


def test_cifar10_python_format(tmp_path, monkeypatch):
    from torchvision import datasets
    from torchvision.datasets import cifar

    from denoiser.data import DataConfig, load_dataset

    folder = _write_cifar10(tmp_path)
    # torchvision checks the official files' md5; ours are a miniature with the same layout
    monkeypatch.setattr(datasets.CIFAR10, "_check_integrity", lambda self: True)
    monkeypatch.setattr(cifar, "check_integrity", lambda *args, **kwargs: True)
    ds = load_dataset(DataConfig(dataset="cifar10", path=str(tmp_path)), 16)
    assert len(ds) == 30 and ds.classes[0] == "airplane" and len(ds.classes) == 10  # training batches only
    assert ds.images.shape == (30, 3, 16, 16) and ds[0][0].shape == (3, 16, 16)
    full = load_dataset(DataConfig(dataset="cifar10", path=str(tmp_path)), 32)
    raw = __import__("pickle").loads((folder / "data_batch_1").read_bytes())
    # row-major CHW bytes -> (3, 32, 32), the first image of the first batch, label kept
    assert torch.equal(full.images[0], torch.from_numpy(raw["data"][0].reshape(3, 32, 32)))
    assert full.labels[0].item() == raw["labels"][0]


def test_cifar10_missing_files_are_explained(tmp_path):
    from denoiser.data import DataConfig, load_dataset

    with pytest.raises(FileNotFoundError, match="cifar-10-batches-py"):
        load_dataset(DataConfig(dataset="cifar10", path=str(tmp_path)), 32)


def _write_shards(root, per_shard=3, shards=2):
    """WebDataset tar shards: <key>.jpg/.png + <key>.cls; one sample without an image, one broken image."""
    import tarfile

    root.mkdir(parents=True, exist_ok=True)
    encoded = []
    for s in range(shards):
        with tarfile.open(root / f"train-{s:03d}.tar", "w") as tar:
            for j in range(per_shard):
                i = s * per_shard + j
                buf = io.BytesIO()
                Image.new("RGB", (10 + i, 9), (30 * i, 200 - 20 * i, 5)).save(buf, format="PNG" if i % 2 else "JPEG")
                encoded.append(buf.getvalue())
                for name, data in ((f"s{i:04d}.{'png' if i % 2 else 'jpg'}", buf.getvalue()), (f"s{i:04d}.cls", str(i % 3).encode())):
                    info = tarfile.TarInfo(name)
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
            for name, data in ((f"x{s}.cls", b"1"), (f"y{s}.jpg", b"broken jpeg")):
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return encoded


def test_webdataset_shards_by_brace_pattern(tmp_path):
    from denoiser.data import load_dataset
    from denoiser.data.webdataset import expand_braces

    assert expand_braces("a/{00..02}.tar") == ["a/00.tar", "a/01.tar", "a/02.tar"]
    assert expand_braces("{x,y}-{1..2}") == ["x-1", "x-2", "y-1", "y-2"]
    encoded = _write_shards(tmp_path / "shards")
    cfg = DataConfig(dataset="webdataset", path=str(tmp_path / "shards" / "train-{000..001}.tar"))
    info = prepare(cfg, 8)
    assert (info.num_items, info.num_images, info.skipped) == (10, 6, 4)  # per shard: no image, broken image
    assert "no image member" in info.skipped_file.read_text()
    ds = load_dataset(cfg, 8)
    ref = torch.stack([torch.from_numpy(decode_image(b, 8)) for b in encoded])
    assert torch.equal(ds.images[torch.arange(6)], ref)
    assert ds.classes == ["0", "1", "2"] and ds.labels.tolist() == [0, 1, 2, 0, 1, 2]
    with pytest.raises(FileNotFoundError, match="1 of the 3 shards"):
        prepare(DataConfig(dataset="webdataset", path=str(tmp_path / "shards" / "train-{000..002}.tar")), 8)


def test_prepare_data_command_prepares_the_store_a_run_opens(tmp_path, capsys):
    import yaml

    from denoiser.cli.main import main
    from tests.conftest import TRAIN_CONFIG

    photo_folder(tmp_path / "photos")
    (tmp_path / "photos" / "cats" / "bad.jpg").write_bytes(b"nope")
    cfg = {**TRAIN_CONFIG, "data": {"dataset": "folder", "path": str(tmp_path / "photos"), "val_size": 2}}
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
    assert main(["prepare-data", "--config", str(tmp_path / "c.yaml")]) == 0
    out = capsys.readouterr().out
    store = prepare(DataConfig(dataset="folder", path=str(tmp_path / "photos")), TRAIN_CONFIG["model"]["sample_size"])
    assert f"store: {store.path}" in out and "images: 6 at 8x8" in out and "skipped 1 of 7 files" in out

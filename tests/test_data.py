"""Datasets: the synthetic set, image folders with awkward files, the validation split."""

from __future__ import annotations

import pytest
import torch
from PIL import Image

from denoiser.config import DataConfig
from denoiser.data import load_datasets, load_folder, make_synthetic, split


def test_synthetic_is_deterministic_labelled_and_in_range():
    a, b = make_synthetic(40, 16, seed=3), make_synthetic(40, 16, seed=3)
    assert torch.equal(a.images, b.images) and torch.equal(a.labels, b.labels)
    assert not torch.equal(a.images, make_synthetic(40, 16, seed=4).images)
    x, y = a.batch(torch.arange(8))
    assert x.shape == (8, 3, 16, 16) and x.min() >= -1 and x.max() <= 1
    assert set(a.labels.tolist()) <= set(range(len(a.classes))) and len(set(a.labels.tolist())) > 1
    # shapes are crisp: most pixels are exactly background or foreground, images are not flat
    assert (a.images.float().flatten(1).std(1) > 5).all()


def _write(root, name, mode="RGB", size=(20, 12)):
    (root).parent.mkdir(parents=True, exist_ok=True)
    Image.new(mode, size, 128 if mode == "L" else (200, 10, 10, 255)[: len(mode)]).save(root)


def test_folder_converts_modes_resizes_and_labels(tmp_path):
    _write(tmp_path / "cats" / "a.png", "RGB")
    _write(tmp_path / "cats" / "b.png", "L")
    _write(tmp_path / "dogs" / "c.png", "RGBA", size=(9, 30))
    ds = load_folder(tmp_path, 8)
    assert ds.images.shape == (3, 3, 8, 8) and ds.images.dtype == torch.uint8
    assert ds.classes == ["cats", "dogs"] and ds.labels.tolist() == [0, 0, 1]


def test_folder_errors_name_the_problem(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_folder(tmp_path / "missing", 8)
    (tmp_path / "empty" / "cls").mkdir(parents=True)
    with pytest.raises(ValueError, match="no images found"):
        load_folder(tmp_path / "empty", 8)
    bad = tmp_path / "bad" / "cls"
    bad.mkdir(parents=True)
    (bad / "broken.png").write_bytes(b"not a png at all")
    with pytest.raises(ValueError, match="broken.png"):
        load_folder(tmp_path / "bad", 8)


def test_validation_split_is_deterministic_and_disjoint():
    ds = make_synthetic(50, 8)
    tr1, va1 = split(ds, 10, seed=0)
    tr2, va2 = split(ds, 10, seed=0)
    assert torch.equal(va1.images, va2.images) and len(tr1) == 40 and len(va1) == 10
    _, va3 = split(ds, 10, seed=1)
    assert not torch.equal(va1.images, va3.images)
    with pytest.raises(ValueError, match="leaves no training images"):
        split(ds, 50, 0)


def test_load_datasets_from_config():
    train, val = load_datasets(DataConfig(num_images=30, val_size=5), 8)
    assert len(train) == 25 and len(val) == 5 and train.images.shape[-1] == 8


def _write_cifar10(root, per_batch=6):
    """A miniature cifar-10-batches-py: the official layout and keys, random pixels."""
    import pickle

    import numpy as np

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

    from denoiser.data import load_cifar10

    folder = _write_cifar10(tmp_path)
    # torchvision checks the official files' md5; ours are a miniature with the same layout
    monkeypatch.setattr(datasets.CIFAR10, "_check_integrity", lambda self: True)
    monkeypatch.setattr(cifar, "check_integrity", lambda *args, **kwargs: True)
    ds = load_cifar10(tmp_path, 16)
    assert len(ds) == 30 and ds.classes[0] == "airplane" and len(ds.classes) == 10  # training batches only
    assert ds.images.shape == (30, 3, 16, 16) and ds.images.dtype == torch.uint8
    full = load_cifar10(tmp_path, 32)
    raw = __import__("pickle").loads((folder / "data_batch_1").read_bytes())
    # row-major CHW bytes -> (3, 32, 32), the first image of the first batch, label kept
    assert torch.equal(full.images[0], torch.from_numpy(raw["data"][0].reshape(3, 32, 32)))
    assert full.labels[0].item() == raw["labels"][0]


def test_cifar10_missing_files_are_explained(tmp_path):
    from denoiser.data import load_cifar10

    with pytest.raises(FileNotFoundError, match="cifar-10-batches-py"):
        load_cifar10(tmp_path, 32)

"""Training images: a source (image folder, Hugging Face dataset, WebDataset shards, CIFAR-10, the built-in shapes) prepared once
into a memory-mapped store (`denoiser.data.store`), then split into training and validation sets.

    train, val = load_datasets(cfg.data, sample_size)   # prepares the store on first use, then maps it

With `data.streaming: true`, WebDataset or Hugging Face shards are read as a stream instead, with no store
(`denoiser.data.stream.open_stream`).
"""

from __future__ import annotations

from pathlib import Path

from denoiser.config import DataConfig
from denoiser.data.decode import fit_to_size, flatten_to_rgb
from denoiser.data.images import ImageDataset, MappedImages, split, to_model_range
from denoiser.data.sources import Cifar10Source, Source, SyntheticSource, list_folder
from denoiser.data.store import StoreInfo, cache_root, open_store, prepare_store
from denoiser.data.synthetic import SHAPES, make_synthetic

__all__ = [
    "ImageDataset", "MappedImages", "StoreInfo", "SHAPES", "make_synthetic", "load_folder", "load_cifar10", "load_dataset",
    "load_datasets", "make_source", "prepare", "open_store", "split", "flatten_to_rgb", "fit_to_size", "to_model_range", "cache_root",
]


def make_source(cfg: DataConfig) -> Source:
    """The source a data config names (listing files, opening a dataset: no pixels read yet)."""
    if cfg.dataset == "synthetic":
        return SyntheticSource(cfg.num_images, cfg.synthetic_seed)
    if cfg.dataset == "folder":
        return list_folder(cfg.path, cfg.label_column)
    if cfg.dataset == "cifar10":
        return Cifar10Source(Path(cfg.path))
    if cfg.dataset == "hf":
        from denoiser.data.hf_source import HFSource

        return HFSource(cfg.path, cfg.image_column, cfg.label_column, cfg.split, str(cache_root() / "hf"))
    if cfg.dataset == "webdataset":
        from denoiser.data.webdataset import WebDatasetSource

        return WebDatasetSource(cfg.path, cfg.label_column)
    raise ValueError(f"unknown dataset {cfg.dataset!r}; use synthetic, folder, hf, webdataset or cifar10")


def prepare(cfg: DataConfig, sample_size: int, progress: bool = True) -> StoreInfo:
    """The store of a data config at `sample_size`, prepared if it is not there yet (`denoiser prepare-data`)."""
    if cfg.streaming:
        raise ValueError(f"data.streaming: true reads the shards of {cfg.path!r} while training; there is no store to "
                         "prepare. Start the run, or remove data.streaming to prepare a store")
    return prepare_store(make_source(cfg), sample_size, cfg.num_workers, progress)


def load_dataset(cfg: DataConfig, sample_size: int) -> ImageDataset:
    """The whole set of a data config, memory-mapped from its store."""
    return open_store(prepare(cfg, sample_size).path)


def load_datasets(cfg: DataConfig, sample_size: int) -> tuple[ImageDataset, ImageDataset]:
    """(train, validation) for a data config at the model's `sample_size`."""
    return split(load_dataset(cfg, sample_size), cfg.val_size, cfg.val_seed)


def load_folder(path: str | Path, size: int) -> ImageDataset:
    """An image folder (class sub-folders, flat, or metadata.csv), resized and centre-cropped to `size`."""
    return load_dataset(DataConfig(dataset="folder", path=str(path)), size)


def load_cifar10(path: str | Path, size: int) -> ImageDataset:
    """CIFAR-10 in its python format (`cifar-10-batches-py` under `path`); never downloads."""
    return load_dataset(DataConfig(dataset="cifar10", path=str(path)), size)

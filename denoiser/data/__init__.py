"""Training images, from a source to this process's batch of each step.

    data = open_training_data(cfg, sample_size, rank, world)   # the one way in for training (training.py)
    train, val = load_datasets(cfg.data, sample_size)          # a whole store, split (evaluation, benchmarks)

The data flow, one module each: the table of sources (sources.py: folder.py, cifar10.py, synthetic.py,
hf_source.py, webdataset.py on the bases of base.py, images decoded by decode.py) -> the prepared store
(store.py) or a stream of shards (stream.py) -> the order of the items (order.py) -> this process's StepBatch
(training.py, images.py), with each image's caption picked for the step when the data carries text (captions.py).
"""

from __future__ import annotations

from denoiser.data.config import DataConfig
from denoiser.data.images import ImageDataset, MappedImages, StepBatch, split
from denoiser.data.order import seed_of
from denoiser.data.sources import SOURCES, open_source
from denoiser.data.store import StoreInfo, cache_root, open_store, prepare_store
from denoiser.data.synthetic import SHAPES, make_synthetic
from denoiser.data.training import TrainingData, open_training_data

__all__ = [
    "DataConfig", "ImageDataset", "MappedImages", "StepBatch", "StoreInfo", "SHAPES", "SOURCES", "TrainingData", "make_synthetic",
    "load_dataset", "load_datasets", "open_source", "open_training_data", "prepare",
    "open_store", "split", "seed_of", "cache_root",
]


def prepare(cfg: DataConfig, sample_size: int, progress: bool = True) -> StoreInfo:
    """The store of a data config at `sample_size`, prepared if it is not there yet (`denoiser prepare-data`)."""
    if cfg.streaming:
        raise ValueError(f"data.streaming: true reads the shards of {cfg.path!r} while training; there is no store to "
                         "prepare. Start the run, or remove data.streaming to prepare a store")
    return prepare_store(open_source(cfg), sample_size, cfg.num_workers, progress)


def load_dataset(cfg: DataConfig, sample_size: int) -> ImageDataset:
    """The whole set of a data config, memory-mapped from its store."""
    return open_store(prepare(cfg, sample_size).path)


def load_datasets(cfg: DataConfig, sample_size: int) -> tuple[ImageDataset, ImageDataset]:
    """(train, validation) for a data config at the model's `sample_size`."""
    return split(load_dataset(cfg, sample_size), cfg.val_size, cfg.val_seed)

"""The `data:` section of a run config (denoiser/train/config.py reads the YAML onto it and checks it against the table
of sources, denoiser/data/sources.py)."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["DataConfig"]


@dataclass
class DataConfig:
    dataset: str = "synthetic"  # "synthetic" (built-in shapes), "folder" (image folder), "hf" (Hugging Face datasets), "webdataset" (tar shards), "cifar10" (python format)
    path: str | None = None  # image folder / dataset folder or cached name / shard pattern (shards/{00000..00099}.tar) / CIFAR-10 folder
    num_images: int = 20000  # size of the synthetic set (images are made on the fly, deterministic by seed)
    synthetic_seed: int = 0  # seed of the synthetic set
    val_size: int = 256  # images held out for validation (a deterministic split)
    val_seed: int = 0  # seed of the validation split
    random_flip: bool = True  # random horizontal flips during training
    image_column: str = "image"  # "hf": the column holding the images
    label_column: str | None = "label"  # "hf", "webdataset" (extension; also .cls) and metadata.csv/jsonl: the class column; absent or null = unconditional
    caption_columns: list[str] = field(default_factory=list)  # each image's candidate captions: "folder" metadata.csv/jsonl columns (e.g. [name, short_name, keywords, category]), "hf" columns, "webdataset" member extensions ([txt]); [] = no captions (denoiser/data/captions.py)
    caption_separator: str | None = "|"  # splits a caption value into several candidates (the emoji set's keywords "fruit|red"); null: a value is one caption
    split: str = "train"  # "hf": the split of a DatasetDict or of a cached dataset name
    num_workers: int | None = None  # processes decoding images, for the store or a stream (None = every core; 1 = this process alone)
    streaming: bool = False  # "webdataset", "hf": read the shards as a stream while training, no store (docs/training-data.md, Streaming)
    shuffle_buffer: int = 1000  # streaming: items in the seeded shuffle buffer (1 = shard order only)

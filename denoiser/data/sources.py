"""The table of training-data sources: one row per `data.dataset` name.

A row says how to open the source from a data config for the store (`open_source`), and for a stream when the
source is sharded (`open_shards`), what `data.path` must be, and whether its items can carry captions. The config's checks read this table
(denoiser/train/config.py), the store and the stream open through it (denoiser/data/training.py). A new source is one
module (a `denoiser.data.base.Source`, and `Shards` if it streams, built from plain arguments) plus one row here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from denoiser.data.base import Shards, Source
from denoiser.data.captions import CaptionSpec, caption_spec
from denoiser.data.cifar10 import Cifar10Source
from denoiser.data.config import DataConfig
from denoiser.data.folder import list_folder
from denoiser.data.hf_source import HFShards, HFSource
from denoiser.data.store import cache_root
from denoiser.data.synthetic import SyntheticSource
from denoiser.data.webdataset import TarShards, WebDatasetSource

__all__ = ["SourceKind", "SOURCES", "source_kind", "open_source", "open_shards", "streamable"]


@dataclass(frozen=True)
class SourceKind:
    open_source: Callable[[DataConfig], Source]  # the source a store is prepared from (no pixels read yet)
    open_shards: Callable[[DataConfig], Shards] | None = None  # its shards, indexed, for data.streaming; None: no stream
    needs_path: bool = True  # data.path is required
    local_path: bool = False  # data.path must exist on this machine when the config is read
    text: bool = False  # its items can carry captions (data.caption_columns)


def _text(d: DataConfig) -> CaptionSpec | None:
    return caption_spec(d.caption_columns, d.caption_separator)


def _hf(d: DataConfig) -> HFSource:
    return HFSource(d.path, d.image_column, d.label_column, d.split, str(cache_root() / "hf"), caption_spec=_text(d))


def _hf_shards(d: DataConfig) -> HFShards:
    return HFShards(d.path, d.image_column, d.label_column, d.split, str(cache_root() / "hf"), _text(d))


def _wds(d: DataConfig) -> WebDatasetSource:
    return WebDatasetSource(d.path, d.label_column, _text(d))


SOURCES: dict[str, SourceKind] = {
    "synthetic": SourceKind(lambda d: SyntheticSource(d.num_images, d.synthetic_seed), needs_path=False),
    "folder": SourceKind(lambda d: list_folder(d.path, d.label_column, _text(d)), local_path=True, text=True),
    "hf": SourceKind(_hf, _hf_shards, text=True),
    "webdataset": SourceKind(_wds, lambda d: TarShards(_wds(d)), text=True),
    "cifar10": SourceKind(lambda d: Cifar10Source(Path(d.path)), local_path=True),
}


def streamable() -> list[str]:
    """The names whose data can be streamed (data.streaming: true)."""
    return [name for name, kind in SOURCES.items() if kind.open_shards is not None]


def source_kind(name: str) -> SourceKind:
    if name not in SOURCES:
        raise ValueError(f"unknown dataset {name!r}; use {', '.join(SOURCES)}")
    return SOURCES[name]


def open_source(cfg: DataConfig) -> Source:
    """The source a data config names (listing files, opening a dataset: no pixels read yet)."""
    return source_kind(cfg.dataset).open_source(cfg)


def open_shards(cfg: DataConfig) -> Shards:
    """The shards a streaming data config names, indexed (tar headers and label members, or row counts and labels)."""
    kind = source_kind(cfg.dataset)
    if kind.open_shards is None:
        raise ValueError(f"data.streaming needs data.dataset {' or '.join(streamable())}, got {cfg.dataset!r}; "
                         "remove data.streaming")
    return kind.open_shards(cfg)

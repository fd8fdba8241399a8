"""WebDataset tar shards as a source: `data.path` a local brace pattern such as `shards/{00000..00099}.tar`.

A sample is the tar members sharing a key (the member name up to the first dot of its file name): its image is
the member with an image extension (jpg, png, webp, ...), its label the integer or name in the member whose
extension is `data.label_column` (`label`, also `cls` by default), its candidate captions the text of the members
whose extensions `data.caption_columns` names (`txt`; denoiser/data/captions.py). The shards are indexed (tar
headers, label and caption members only), then images are read by offset: in parallel, like files, when the store
is prepared, or item by item by a stream (`TarShards`, `data.streaming: true`, denoiser/data/stream.py).
"""

from __future__ import annotations

import re
import tarfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from denoiser.data.base import Chunk, Shards, Source, content_key, gather, labels_from
from denoiser.data.captions import Candidates, CaptionSpec
from denoiser.data.decode import decode_image, is_image_name

__all__ = ["WebDatasetSource", "TarShards", "expand_braces"]


def expand_braces(pattern: str) -> list[str]:
    """`a/{000..002}.tar` -> a/000.tar, a/001.tar, a/002.tar (zero padding kept); `{x,y}` lists; nested left to right."""
    m = re.search(r"\{([^{}]*)\}", pattern)
    if m is None:
        return [pattern]
    head, tail, body = pattern[: m.start()], pattern[m.end() :], m.group(1)
    rng = re.fullmatch(r"(\d+)\.\.(\d+)", body)
    if rng:
        lo, hi = rng.groups()
        options = [str(i).zfill(len(lo)) for i in range(int(lo), int(hi) + 1)]
    else:
        options = body.split(",")
    return [p for opt in options for p in expand_braces(head + opt + tail)]


@dataclass
class _Sample:
    shard: int
    key: str
    offset: int | None  # of the image member's data in the tar file; None: the sample has no image
    size: int = 0
    label: object = None
    texts: dict[str, str] = field(default_factory=dict)  # caption member extension -> its text


@dataclass
class WebDatasetSource(Source):
    pattern: str
    label_column: str | None = "label"
    caption_spec: CaptionSpec | None = None  # its columns are member extensions
    name: str = "webdataset"
    _samples: list[_Sample] | None = field(default=None, repr=False)
    _labels: list[int] = field(default_factory=list, repr=False)
    _classes: list[str] = field(default_factory=list, repr=False)
    _candidates: list[Candidates] | None = field(default=None, repr=False)  # each sample's caption groups

    def __post_init__(self):
        self.shards = [Path(p).expanduser() for p in expand_braces(self.pattern)]
        missing = [p for p in self.shards if not p.is_file()]
        if missing:
            raise FileNotFoundError(f"{len(missing)} of the {len(self.shards)} shards of data.path {self.pattern!r} do not "
                                    f"exist (e.g. {missing[0]}); check the pattern, e.g. shards/{{00000..00099}}.tar")
        self.name = "wds-" + "".join(c if c.isalnum() else "-" for c in self.shards[0].parent.name)[:40]
        if self.caption_spec is not None:
            self._index()  # caption members the samples lack are refused now, before a store is started

    def fingerprint(self) -> str:
        return content_key(((str(p), p, "") for p in self.shards), extra=f"{self.label_column}\n")

    def _index(self) -> list[_Sample]:
        """Every sample of every shard, in shard and member order (headers and label members read, no images)."""
        if self._samples is None:
            label_exts = {self.label_column, "cls"} if self.label_column == "label" else {self.label_column}
            text_exts = set(self.caption_spec.columns) if self.caption_spec else set()
            samples: dict[tuple[int, str], _Sample] = {}
            exts: set[str] = set()  # every member extension seen, for the caption check's message
            for i, shard in enumerate(self.shards):
                with tarfile.open(shard) as tar:
                    for m in tar:
                        if not m.isfile():
                            continue
                        folder, _, base = m.name.rpartition("/")
                        stem, _, ext = base.partition(".")
                        exts.add(ext)
                        s = samples.setdefault((i, f"{folder}/{stem}" if folder else stem), _Sample(i, stem, None))
                        if s.offset is None and is_image_name(base):
                            s.offset, s.size = m.offset_data, m.size
                        elif ext in label_exts:
                            s.label = tar.extractfile(m).read().decode().strip()
                        elif ext in text_exts:
                            s.texts[ext] = tar.extractfile(m).read().decode("utf-8", errors="replace")
            if self.caption_spec is not None:
                self.caption_spec.check(sorted(exts), f"the samples of {self.pattern!r}", "member extension")
            self._samples = list(samples.values())
            if self.caption_spec is not None:
                spec = self.caption_spec
                self._candidates = [spec.candidates([s.texts.get(c) for c in spec.columns]) for s in self._samples]
            labelled = [s.label for s in self._samples if s.label is not None]
            if labelled:
                indices, self._classes = labels_from(labelled, self.label_column, self.pattern)
                it = iter(indices)
                self._labels = [next(it) if s.label is not None else 0 for s in self._samples]
            else:
                self._labels = [0] * len(self._samples)
        return self._samples

    @property
    def classes(self) -> list[str]:
        self._index()
        return self._classes

    def __len__(self) -> int:
        return len(self._index())

    def read(self, start: int, stop: int, size: int) -> Chunk:
        samples = self._index()[start:stop]
        handles: dict[int, object] = {}

        def decode(item: str) -> np.ndarray:
            s = samples[int(item.split(":", 1)[0]) - start]
            if s.offset is None:
                raise ValueError("the sample has no image member")
            f = handles.setdefault(s.shard, open(self.shards[s.shard], "rb"))  # noqa: SIM115 - closed below
            f.seek(s.offset)
            return decode_image(f.read(s.size), size)

        names = [f"{start + j}:{self.shards[s.shard].name}/{s.key}" for j, s in enumerate(samples)]
        texts = None if self._candidates is None else self._candidates[start:stop]
        try:
            return gather(list(zip(names, self._labels[start:stop])), size, decode, texts)
        finally:
            for f in handles.values():
                f.close()


class TarShards(Shards):
    """A WebDatasetSource's shards as a stream reads them: its index (the same labels, classes and captions as its store),
    grouped by shard; a sample without an image member is left out here, and counted in `dropped`."""

    def __init__(self, source: WebDatasetSource):
        self.where, self.paths, self.classes = source.pattern, source.shards, source.classes
        rows: list[list[tuple]] = [[] for _ in self.paths]  # per shard: offset, size, label, key, caption groups
        self.dropped = []
        samples = source._index()
        texts = source._candidates or [[]] * len(samples)
        for sample, label, text in zip(samples, source._labels, texts):
            if sample.offset is None:
                self.dropped.append((f"{self.paths[sample.shard].name}/{sample.key}", "the sample has no image member"))
            else:
                rows[sample.shard].append((sample.offset, sample.size, label, sample.key, text))
        self.sizes = [len(r) for r in rows]
        self.offsets = [np.array([r[0] for r in shard], dtype=np.int64) for shard in rows]
        self.lengths = [np.array([r[1] for r in shard], dtype=np.int64) for shard in rows]
        self.labels = [np.array([r[2] for r in shard], dtype=np.int64) for shard in rows]
        self.keys = [[r[3] for r in shard] for shard in rows]
        self.candidates = None if source._candidates is None else [[r[4] for r in shard] for shard in rows]

    def encoded(self, shard: int, item: int) -> bytes:
        with open(self.paths[shard], "rb") as f:  # opened per item: no file position shared with forked workers
            f.seek(int(self.offsets[shard][item]))
            return f.read(int(self.lengths[shard][item]))

    def item_name(self, shard: int, item: int) -> str:
        return f"{self.paths[shard].name}/{self.keys[shard][item]}"

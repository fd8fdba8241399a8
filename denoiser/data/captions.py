"""Captions: the texts each image carries, and the one it is trained with at each step.

`data.caption_columns` names where the text is: a folder's metadata.csv / metadata.jsonl columns, a Hugging Face
dataset's columns (a string, or a list of strings), or a WebDataset sample's members by extension (`txt`). Each
image's *candidates* are those values in column order, as groups, one per column with a value:

    name "red apple", short_name "apple", keywords "fruit|red", category "Food & Drink"
    -> [["red apple"], ["apple"], ["fruit", "red"], ["Food & Drink"]]

A value is split by `data.caption_separator` (the emoji set joins its keywords with "|"; null: never split), texts
are stripped, empty ones dropped, and a text already in an earlier group (ignoring case) is left out, so an image
whose short name equals its name is not asked for that name twice as often. An image with no text has no groups.

The pick, at step s for the image with id i (a store row, or a stream's global item number): a generator seeded by
`seed_of(CAPTIONS, train.seed, s)` and i (Python's Mersenne Twister seeded with both as one integer: one SeedSequence
per step, not per image, which is 5x cheaper) draws u, then a group, then a text of that group: each column is equally
likely, then each of its values. With u < caption dropout the caption is "" (no condition: what classifier-free
guidance needs); an image without text gets "" too. The pick depends on nothing else: not on the process, their
number, gradient accumulation, DataLoader workers, or where a run resumed, and a kept pick is the same whatever
the dropout rate, since u is always drawn first.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch

from denoiser.data.order import CAPTIONS, seed_of

__all__ = ["Candidates", "CaptionSpec", "CaptionTable", "CaptionPick", "caption_spec", "pick_caption"]

Candidates = list[list[str]]  # one image's groups of texts, one group per caption column with a value

FORMAT = 1  # bump when the candidates' rule changes: every store with captions is prepared again


@dataclass(frozen=True)
class CaptionSpec:
    """Which text the data carries: `data.caption_columns` and `data.caption_separator`."""

    columns: tuple[str, ...]
    separator: str | None = "|"

    @property
    def key(self) -> str:
        """Part of the store's key: asking for captions, or for others, prepares another store."""
        return f"captions-v{FORMAT}:{chr(31).join(self.columns)}:{self.separator!r}"

    def candidates(self, values: Sequence[object]) -> Candidates:
        """One image's values, in column order (None, "" or [] where it has none) -> its groups of texts."""
        seen: set[str] = set()
        groups = []
        for value in values:
            group = []
            for text in self._texts(value):
                if text.casefold() not in seen:
                    seen.add(text.casefold())
                    group.append(text)
            if group:
                groups.append(group)
        return groups

    def _texts(self, value: object) -> Iterable[str]:
        if value is None:
            return []
        parts = value if isinstance(value, (list, tuple)) else [value]
        texts = []
        for part in parts:
            if part is None:
                continue
            part = part.decode() if isinstance(part, bytes) else str(part)
            texts += part.split(self.separator) if self.separator else [part]
        return [t.strip() for t in texts if t.strip()]

    def check(self, have: Iterable[str], where: str, what: str = "column") -> None:
        """Refuse caption columns the data lacks, naming those it has."""
        have = list(have)
        missing = [c for c in self.columns if c not in have]
        if missing:
            raise ValueError(f"data.caption_columns names the {what}{'s' if len(missing) > 1 else ''} "
                             f"{', '.join(map(repr, missing))}, not in {where} (found there: {', '.join(have) or 'none'}); "
                             "set data.caption_columns to some of those, or to [] for no captions")


def caption_spec(columns: Sequence[str], separator: str | None) -> CaptionSpec | None:
    """The spec of a data config's caption fields; None when it asks for no captions."""
    return CaptionSpec(tuple(columns), separator) if columns else None


class CaptionTable:
    """Every image's candidates, (N,) as an Arrow column list<list<string>>: memory-mapped from a store, or built in
    memory. Indexing with a tensor of rows reads only those rows; `take` is a view."""

    def __init__(self, column, rows: torch.Tensor | None = None):
        import pyarrow as pa

        if not isinstance(column, pa.ChunkedArray):
            column = pa.chunked_array([pa.array(column, type=pa.list_(pa.list_(pa.string())))])
        self.column, self.rows = column, rows  # rows: this view's rows of the column; None = all of them

    def __len__(self) -> int:
        return len(self.column) if self.rows is None else len(self.rows)

    def __getitem__(self, index: torch.Tensor | Sequence[int]) -> list[Candidates]:
        idx = torch.as_tensor(index, dtype=torch.long).reshape(-1)
        if self.rows is not None:
            idx = self.rows[idx]
        return self.column.take(idx.numpy()).to_pylist()

    def take(self, rows: torch.Tensor) -> CaptionTable:
        return CaptionTable(self.column, rows if self.rows is None else self.rows[rows])


def pick_caption(candidates: Candidates, seed: int, step: int, item: int, dropout: float = 0.0) -> str:
    """The caption of image `item` at step `step` (see the module docstring): "" when dropped or without text."""
    return _pick(candidates, seed_of(CAPTIONS, seed, step), item, dropout)


def _pick(candidates: Candidates, step_seed: int, item: int, dropout: float) -> str:
    if item < 0:
        raise ValueError(f"image ids are store rows or stream item numbers, >= 0; got {item}")
    rng = random.Random(step_seed << 64 | item)  # step_seed < 2**64: distinct (step, item) seed distinct generators
    if rng.random() < dropout or not candidates:
        return ""
    group = candidates[rng.randrange(len(candidates))]
    return group[rng.randrange(len(group))]


@dataclass(frozen=True)
class CaptionPick:
    """A run's rule for picking captions: its seed (train.seed) and the caption dropout (train.caption_dropout)."""

    seed: int
    dropout: float = 0.0

    def __call__(self, candidates: Sequence[Candidates], ids: Sequence[int], step: int) -> list[str]:
        """One caption per image of step `step`, image k with id `ids[k]` picking among `candidates[k]`."""
        step_seed = seed_of(CAPTIONS, self.seed, step)
        return [_pick(c, step_seed, int(i), self.dropout) for c, i in zip(candidates, ids)]

"""Files written whole or not at all: write to a temporary sibling, then rename it into place.

A reader (another process, a crash-resumed run) never sees half a file, and a failed write keeps what was
saved before. Model folders and checkpoints, which are folders, do the same in `pipeline.save_pipeline` and
`checkpoint.save_checkpoint`.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

__all__ = ["atomic_path"]


@contextlib.contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """A temporary sibling of `path` to write to; renamed onto `path` when the block ends without an error,
    removed when it fails. The parent folder is created."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        yield tmp
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)

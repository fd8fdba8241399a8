"""Files and folders written whole or not at all: write to a temporary sibling, then rename it into place.

A reader (another process, a crash-resumed run) never sees half a file or half a folder, and a failed write
keeps what was saved before. The one home of that rule for the package: a run's config.yaml, run_info.json,
train_summary.json and loss.png, PNGs with their settings (`image_io.save_png`) and the app's Edit pictures, FID
statistics and attention statistics (`atomic_path` on a file); model folders (`pipeline.save_pipeline`, and
best-model/ with its fid.json: `atomic_path` on a folder); checkpoints written by every process of a run
(`checkpoint.save_checkpoint`: `temp_sibling` + `publish`, the steps apart, with barriers between them); and the
prepared data store. Logs that grow by a line at a time (loss.csv, fid.csv) are appended to instead: a kill cuts
at most the last line, which loss.csv's reader skips, and a resumed run rewrites loss.csv through `atomic_path`
when it cuts it back.

The temporary sibling is `.<name>.tmp-<tag>` in the same folder (a rename across folders may copy); a folder
being replaced is moved aside to `.<name>.old-<tag>` for the moment the new one takes its place. A writer
killed midway leaves only such hidden names; `remove_temporaries` clears them where no one else writes.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
from collections.abc import Iterator
from pathlib import Path

__all__ = ["atomic_path", "temp_sibling", "publish", "remove_temporaries", "is_temporary"]


def temp_sibling(path: str | Path, tag: str | None = None) -> Path:
    """Where `path` is written before it is published: `.<name>.tmp-<tag>` beside it. The default tag (this
    process and a random part) is unique to one writer; processes writing one folder together agree on a tag."""
    path = Path(path)
    return path.with_name(f".{path.name}.tmp-{tag or _unique_tag()}")


def publish(tmp: str | Path, path: str | Path) -> None:
    """Move the finished `tmp` onto `path`. A file replaces the old one in one rename; a folder replaces an
    existing folder only now that the new one is complete (the old one is renamed aside, the new one into
    place, the old one removed: a reader in between finds no folder rather than half of one)."""
    tmp, path = Path(tmp), Path(path)
    if not (tmp.is_dir() and path.is_dir()):
        tmp.replace(path)
        return
    old = path.with_name(f".{path.name}.old-{_unique_tag()}")
    path.replace(old)
    tmp.replace(path)
    shutil.rmtree(old, ignore_errors=True)


def is_temporary(name: str) -> bool:
    """Whether a file name is one of these writers' temporaries (also the `.tmp-<name>` checkpoints once used)."""
    return name.startswith(".") and (".tmp-" in name or ".old-" in name)


def remove_temporaries(path: str | Path) -> None:
    """Delete what writers of `path` killed midway left beside it. Only where no one else is writing `path`
    now (the process that holds its lock, or a run's main process at start)."""
    path = Path(path)
    for pattern in (f".{path.name}.tmp-*", f".{path.name}.old-*"):
        for p in path.parent.glob(pattern):
            _remove(p)


@contextlib.contextmanager
def atomic_path(path: str | Path, tag: str | None = None) -> Iterator[Path]:
    """A temporary sibling of `path` to write a file or a folder to (the block creates it); published onto
    `path` when the block ends without an error (`publish`), removed when it fails. The parent folder is
    created."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_sibling(path, tag)
    _remove(tmp)  # a stale one of the same tag
    try:
        yield tmp
        publish(tmp, path)
    finally:
        _remove(tmp)


def _unique_tag() -> str:
    return f"{os.getpid()}-{secrets.token_hex(4)}"  # the pid says whose it was; the rest separates threads


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)

"""Pack a config's training split (never its validation split) into one safetensors file for a lent GPU.

    .venv/bin/python -m tools.gpu.pack_data configs/cifar10.yaml .gpu/data/cifar10.safetensors

The device gets only the working tree (64 MiB), so the image files travel as their raw bytes, packed
back to back, with their relative paths; tools/gpu/unpack_data.py writes the folder again there.
A metadata.csv in the folder travels too, cut to the packed files' rows (its `file_name` or `file` column).
The split is `denoiser.data.split`'s: the same seeded permutation over ImageFolder's file order.
"""

from __future__ import annotations

import csv
import io
import json
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file
from torchvision import datasets

from denoiser.train.config import load_config


def main(config: str, out: str) -> None:
    cfg = load_config(config)
    root = Path(cfg.data.path).expanduser()
    samples = datasets.ImageFolder(str(root)).samples  # [(path, label)] in ImageFolder's order
    perm = torch.randperm(len(samples), generator=torch.Generator().manual_seed(cfg.data.val_seed))
    train = perm[cfg.data.val_size :].sort().values.tolist()
    blobs = [Path(samples[i][0]).read_bytes() for i in train]
    offsets = torch.tensor([0] + [len(b) for b in blobs], dtype=torch.int64).cumsum(0)
    data = torch.frombuffer(bytearray(b"".join(blobs)), dtype=torch.uint8)
    paths = [str(Path(samples[i][0]).relative_to(root)) for i in train]
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    metadata = {"paths": json.dumps(paths)}
    if (root / "metadata.csv").is_file():
        metadata["metadata.csv"] = metadata_rows(root / "metadata.csv", set(paths))
    save_file({"bytes": data, "offsets": offsets}, out, metadata=metadata)
    print(f"{out}: {len(train)} training images of {len(samples)} ({data.numel() / 1e6:.1f} MB)")


def metadata_rows(meta: Path, paths: set[str]) -> str:
    """The CSV text of `meta` with only the rows that name one of `paths` (same columns, same order)."""
    with open(meta, newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        name = next((c for c in ("file_name", "file") if c in reader.fieldnames), None)
        if name is None:
            raise ValueError(f"{meta} has no file_name (or file) column to tell which rows to pack; add one")
        rows = [r for r in reader if str(Path(r[name])) in paths]
    text = io.StringIO()
    writer = csv.DictWriter(text, reader.fieldnames, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return text.getvalue()


if __name__ == "__main__":
    main(*sys.argv[1:])

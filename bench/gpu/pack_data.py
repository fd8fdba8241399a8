"""Pack a config's training split (never its validation split) into one safetensors file for a lent GPU.

    .venv/bin/python bench/gpu/pack_data.py configs/cifar10.yaml .gpu/data/cifar10.safetensors

The device gets only the working tree (64 MiB), so the image files travel as their raw bytes, packed
back to back, with their relative paths; bench/gpu/unpack_data.py writes the folder again there.
The split is `denoiser.data.split`'s: the same seeded permutation over ImageFolder's file order.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file
from torchvision import datasets

from denoiser.config import load_config


def main(config: str, out: str) -> None:
    cfg = load_config(config)
    root = Path(cfg.data.path)
    samples = datasets.ImageFolder(str(root)).samples  # [(path, label)] in ImageFolder's order
    perm = torch.randperm(len(samples), generator=torch.Generator().manual_seed(cfg.data.val_seed))
    train = perm[cfg.data.val_size :].sort().values.tolist()
    blobs = [Path(samples[i][0]).read_bytes() for i in train]
    offsets = torch.tensor([0] + [len(b) for b in blobs], dtype=torch.int64).cumsum(0)
    data = torch.frombuffer(bytearray(b"".join(blobs)), dtype=torch.uint8)
    paths = [str(Path(samples[i][0]).relative_to(root)) for i in train]
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    save_file({"bytes": data, "offsets": offsets}, out, metadata={"paths": json.dumps(paths)})
    print(f"{out}: {len(train)} training images of {len(samples)} ({data.numel() / 1e6:.1f} MB)")


if __name__ == "__main__":
    main(*sys.argv[1:])

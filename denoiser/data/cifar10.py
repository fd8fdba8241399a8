"""CIFAR-10 in its python format as a source (`data.dataset: cifar10`): `cifar-10-batches-py` under `data.path`,
its training batches; never downloads (torchvision's CIFAR10 with download=False)."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from denoiser.data.base import Chunk, Source, content_key

__all__ = ["Cifar10Source"]


@dataclass
class Cifar10Source(Source):
    path: Path
    name: str = "cifar10"
    parallel = False  # already decoded: one process reads it in seconds

    @property
    def classes(self) -> list[str]:
        return list(_cifar10(str(self.path)).classes)

    def __len__(self) -> int:
        return len(_cifar10(str(self.path)).data)

    def fingerprint(self) -> str:
        """From the files' sizes and times: a prepared store opens without unpickling the 150 MB batches."""
        folder = Path(self.path) / "cifar-10-batches-py"
        if not folder.is_dir():
            _cifar10(str(self.path))  # raises, explaining what is missing
        return "cifar10-" + content_key((p.name, p, "") for p in sorted(folder.iterdir()))

    def read(self, start: int, stop: int, size: int) -> Chunk:
        import torch
        from torchvision.transforms import functional as TF

        ds = _cifar10(str(self.path))
        images = torch.from_numpy(ds.data[start:stop]).permute(0, 3, 1, 2).contiguous()  # (n, 32, 32, 3) -> (n, 3, 32, 32)
        if size != images.shape[-1]:
            images = TF.resize(images, [size, size], antialias=True)
        return Chunk(images.numpy(), np.asarray(ds.targets[start:stop], dtype=np.int64))


@functools.cache
def _cifar10(path: str):
    from torchvision import datasets

    try:
        return datasets.CIFAR10(path, train=True, download=False)
    except RuntimeError as err:
        raise FileNotFoundError(
            f"no CIFAR-10 python files under {path!r} ({err}); put cifar-10-batches-py there, "
            "or use dataset: folder for an image folder"
        ) from None

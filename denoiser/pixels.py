"""Pixel ranges, one home: the three ranges an image takes on its way through the package, and the conversions.

- uint8 [0, 255]: files, photos, training stores (`denoiser.data`), FID's images.
- unit [0, 1]: the images sampling and restoring return, previews, grids.
- model [-1, 1]: what the UNet sees (DDPM's convention, Ho et al. 2020: x₀ scaled to [-1, 1]).

Each conversion is written once here, in the order of operations that keeps results bit-identical to the
package's earlier inline arithmetic: `x.float() / 127.5 - 1` into the model's range, `x / 2 + 0.5` then a
clamp out of it, and to uint8 `x · 255`, rounded, then clamped (a clamp before the rounding gives the same
bytes for finite inputs; a float outside [0, 255] cast to uint8 would wrap, hence the clamp). The module
imports torch only: the data package, the sampling core and the app all use it without importing each other.
"""

from __future__ import annotations

import torch

__all__ = ["to_model_range", "to_unit", "to_uint8", "uint8_to_unit", "unit_to_model"]


def to_model_range(images: torch.Tensor) -> torch.Tensor:
    """uint8 [0, 255] -> float [-1, 1]."""
    return images.float().div(127.5).sub(1.0)


def to_unit(x: torch.Tensor) -> torch.Tensor:
    """The model's range [-1, 1] -> [0, 1], clamped, on the CPU in fp32 (to_model_range's inverse, / 255)."""
    return (x.float().cpu() / 2 + 0.5).clamp(0, 1)


def unit_to_model(images: torch.Tensor) -> torch.Tensor:
    """[0, 1] -> the model's range [-1, 1]."""
    return images * 2 - 1


def uint8_to_unit(images: torch.Tensor) -> torch.Tensor:
    """uint8 [0, 255] -> float [0, 1]."""
    return images.float() / 255


def to_uint8(images: torch.Tensor) -> torch.Tensor:
    """[0, 1] -> uint8 [0, 255]: rounded to the nearest level, anything outside clamped."""
    return images.mul(255).round().clamp(0, 255).to(torch.uint8)

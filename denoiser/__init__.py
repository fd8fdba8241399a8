"""denoiser: an attention U-Net diffusion model, its training loop, sampler and web app.

The names below load on first use (PEP 562), so `import denoiser` and the command line start without torch;
`DenoiserPipeline` is registered with diffusers whenever diffusers is imported (denoiser.sampling.registry).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from denoiser.sampling.registry import register_with_diffusers

if TYPE_CHECKING:
    from denoiser.model.attention import (
        AttentionHead,
        MultiHeadAttention,
        MultiHeadCrossAttention,
        MultiHeadSelfAttention,
        scaled_dot_product_attention,
    )
    from denoiser.model.attention_blocks import SpatialCrossAttention, SpatialSelfAttention
    from denoiser.model.attention_capture import capture_attention
    from denoiser.model.unet import UNet
    from denoiser.request import SampleRequest
    from denoiser.sampling.pipeline import DenoiserPipeline

# public name -> the module that defines it
_EXPORTS = {
    "AttentionHead": "denoiser.model.attention",
    "MultiHeadAttention": "denoiser.model.attention",
    "MultiHeadCrossAttention": "denoiser.model.attention",
    "MultiHeadSelfAttention": "denoiser.model.attention",
    "SpatialCrossAttention": "denoiser.model.attention_blocks",
    "SpatialSelfAttention": "denoiser.model.attention_blocks",
    "capture_attention": "denoiser.model.attention_capture",
    "scaled_dot_product_attention": "denoiser.model.attention",
    "DenoiserPipeline": "denoiser.sampling.pipeline",
    "SampleRequest": "denoiser.request",
    "UNet": "denoiser.model.unet",
}

__all__ = [
    "AttentionHead",
    "DenoiserPipeline",
    "MultiHeadAttention",
    "MultiHeadCrossAttention",
    "MultiHeadSelfAttention",
    "SampleRequest",
    "SpatialCrossAttention",
    "SpatialSelfAttention",
    "UNet",
    "capture_attention",
    "scaled_dot_product_attention",
]
__version__ = "0.1.0"


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'denoiser' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))


register_with_diffusers()

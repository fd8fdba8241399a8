"""denoiser: an attention U-Net diffusion model, its training loop, sampler and web app."""

from denoiser.attention import (
    AttentionHead,
    MultiHeadSelfAttention,
    SpatialSelfAttention,
    capture_attention,
    scaled_dot_product_attention,
)
from denoiser.pipeline import DenoiserPipeline  # also registers it with diffusers
from denoiser.unet import UNet

__all__ = [
    "AttentionHead",
    "DenoiserPipeline",
    "MultiHeadSelfAttention",
    "SpatialSelfAttention",
    "UNet",
    "capture_attention",
    "scaled_dot_product_attention",
]
__version__ = "0.1.0"

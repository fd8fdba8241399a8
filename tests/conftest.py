from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402
import torch  # noqa: E402

TINY = dict(
    sample_size=16, base_channels=16, channel_mult=(1, 2), layers_per_block=1, attention_resolutions=(8,),
    mid_attention=True, num_heads=2, norm_num_groups=8,
)


@pytest.fixture
def tiny_unet():
    torch.manual_seed(0)
    from denoiser import UNet

    return UNet(**TINY).eval()

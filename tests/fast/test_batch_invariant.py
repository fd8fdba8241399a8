"""Batch invariance (denoiser.fast.batch_invariant): an image's pixels come out the same bits in any batch, in every precision
a sampling door runs."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from denoiser.fast import batch_invariant
from denoiser.fast.precision import choose_precision, running
from denoiser.sampling.loop import sampling_context


@pytest.mark.parametrize("choice", ["float32", "mixed", "bfloat16"])
def test_an_images_rows_come_out_the_same_bits_in_any_batch(class_unet, choice):
    """The batch never moves a pixel (docs/reproducibility.md): Winograd's blocks are per image, and the timestep
    path's rows are multiplied one at a time (MKL rounds a small GEMM's rows differently with their number)."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(6, 3, 16, 16, generator=g).contiguous(memory_format=torch.channels_last)
    t, labels = torch.tensor([500, 500, 500, 40, 40, 40]), torch.tensor([0, 1, 2, 3, 3, 3])
    with torch.inference_mode(), running(choose_precision(class_unet, choice)), sampling_context(class_unet):
        whole = class_unet(x, t, class_labels=labels).sample
        for some in ([2, 5], [0], [1, 2, 3, 4]):
            assert torch.equal(class_unet(x[some], t[some], class_labels=labels[some]).sample, whole[some]), some


def test_rows_is_linear_row_by_row():
    g = torch.Generator().manual_seed(4)
    x, w, b = torch.randn(5, 24, generator=g), torch.randn(40, 24, generator=g), torch.randn(40, generator=g)
    torch.testing.assert_close(batch_invariant.rows(x, w, b), F.linear(x, w, b))
    torch.testing.assert_close(batch_invariant.rows(x, w, None), F.linear(x, w))
    assert torch.equal(batch_invariant.rows(x[3:4], w, b), batch_invariant.rows(x, w, b)[3:4])


def test_use_batch_invariant_swaps_the_timestep_linears_and_the_rgb_convolutions_only():
    net = nn.Sequential(nn.Linear(8, 8), nn.Conv2d(3, 64, 3, padding=1), nn.Conv2d(64, 64, 3, padding=1),
                        nn.Conv2d(64, 64, 1), nn.Conv2d(64, 64, 3, stride=2, padding=1))
    batch_invariant.use_batch_invariant(net)
    assert [type(m) for m in net] == [batch_invariant.Linear, batch_invariant.PerImageConv2d, nn.Conv2d, nn.Conv2d, batch_invariant.PerImageConv2d]
    x = torch.randn(4, 3, 9, 9)
    with torch.inference_mode():
        batch = net[1](x)
        assert torch.equal(batch[2:3], net[1](x[2:3]))
        torch.testing.assert_close(batch, F.conv2d(x, net[1].weight, net[1].bias, padding=1))

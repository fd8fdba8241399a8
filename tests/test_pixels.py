"""Pixel ranges (denoiser.pixels): each conversion gives the bytes of the inline arithmetic it replaced, and the
module stands apart from the training-data package."""

from __future__ import annotations

import subprocess
import sys

import torch

from denoiser.pixels import to_model_range, to_uint8, to_unit, uint8_to_unit, unit_to_model

LEVELS = torch.arange(256, dtype=torch.uint8).reshape(1, 1, 16, 16)  # every uint8 level


def _around_unit(seed: int = 0) -> torch.Tensor:
    """(2, 3, 13, 7) values in [-0.2, 1.2]: inside [0, 1] and outside it on both sides, awkward sizes."""
    return torch.rand((2, 3, 13, 7), generator=torch.Generator().manual_seed(seed)) * 1.4 - 0.2


def test_uint8_levels_into_the_models_range_and_back():
    x = to_model_range(LEVELS)
    assert torch.equal(x, LEVELS.float() / 127.5 - 1)  # image_io's and the tiles' inline form, bit for bit
    assert float(x.min()) == -1.0 and float(x.max()) == 1.0
    assert torch.equal(to_uint8(to_unit(x)), LEVELS)  # every level survives the round trip
    assert torch.equal(uint8_to_unit(LEVELS), LEVELS / 255)  # the CLI's and the app's photo / 255


def test_to_unit_is_both_earlier_orders_of_clamping():
    x = torch.randn((2, 3, 13, 7), generator=torch.Generator().manual_seed(1)) * 1.5  # a third outside [-1, 1]
    assert torch.equal(to_unit(x), (x / 2 + 0.5).clamp(0, 1))  # image_io's
    assert torch.equal(to_unit(x), x.clamp(-1, 1) / 2 + 0.5)  # the tiles'
    assert to_unit(x.double()).dtype == torch.float32


def test_to_uint8_rounds_and_saturates():
    x = _around_unit()
    assert torch.equal(to_uint8(x), x.clamp(0, 1).mul(255).round().to(torch.uint8))  # the CLI's noise round trip
    inside = x.clamp(0, 1)
    assert torch.equal(to_uint8(inside), (inside * 255).round().to(torch.uint8))  # to_pil's, the app's, FID's
    assert to_uint8(torch.tensor([1.2, -0.2, 0.5])).tolist() == [255, 0, 128]  # saturates instead of wrapping


def test_unit_to_model_is_the_inline_form():
    x = _around_unit(2).clamp(0, 1)
    assert torch.equal(unit_to_model(x), x * 2 - 1)
    torch.testing.assert_close(unit_to_model(uint8_to_unit(LEVELS)), to_model_range(LEVELS))  # two paths, one range


def test_pixels_import_no_training_data_code():
    code = "import sys, denoiser.pixels; print(sorted(m for m in sys.modules if m.startswith('denoiser.')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "denoiser.data" not in out and "denoiser.pixels" in out

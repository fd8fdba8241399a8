"""The request's own checks: what a sampling request may name."""

from __future__ import annotations

import pytest
from diffusers import DDPMScheduler

from denoiser.sampling.loop import make_sampler
from denoiser.sampling.request import TIMESTEP_SPACINGS, check_timestep_spacing


def test_timestep_spacing_is_checked_in_one_place():
    assert [check_timestep_spacing(s) for s in TIMESTEP_SPACINGS] == list(TIMESTEP_SPACINGS)
    assert check_timestep_spacing(None) is None  # the scheduler config's own
    message = "timestep spacing must be one of leading, trailing, linspace, got 'sideways'"
    with pytest.raises(ValueError, match=message):
        check_timestep_spacing("sideways")
    with pytest.raises(ValueError, match=message):  # make_sampler checks through it
        make_sampler("ddim", DDPMScheduler().config, timestep_spacing="sideways")

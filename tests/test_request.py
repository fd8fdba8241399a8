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


def test_every_door_takes_its_defaults_from_the_one_table():
    """Issue 59 finding 3: the number of images defaulted to 16, 4, 1 and 8 in four doors, the training grids' steps
    and attention-stats' DDIM-25 were written apart from BUILT_IN. Each is read from the table now: changing a value
    there changes every door."""
    import argparse
    import inspect

    from denoiser.app.engine import Engine
    from denoiser.cli.main import build_parser
    from denoiser.sampling.loop import sample
    from denoiser.sampling.request import BUILT_IN, SampleRequest
    from denoiser.train.config import TrainConfig

    def command(name):
        parser = build_parser(name)
        return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[name]

    def default(parser, flag):
        return next(a.default for a in parser._actions if flag in a.option_strings)

    assert SampleRequest().num_images == BUILT_IN["num_images"]
    assert inspect.signature(sample).parameters["num_images"].default == BUILT_IN["num_images"]
    assert inspect.signature(sample).parameters["num_inference_steps"].default == BUILT_IN["steps"]
    assert inspect.signature(Engine.generate).parameters["num_images"].default == BUILT_IN["num_images"]
    assert default(command("sample"), "--num-images") == BUILT_IN["num_images"]
    stats = command("attention-stats")
    assert default(stats, "--num-images") == BUILT_IN["num_images"]
    assert f"{BUILT_IN['statistics_scheduler']}-{BUILT_IN['statistics_steps']}" in next(
        a.help for a in stats._actions if "--num-images" in a.option_strings)
    assert TrainConfig().sample_steps == BUILT_IN["steps"]
    for name in ("sample", "denoise", "edit"):  # unset: the model folder's own, never a number written in the door
        assert default(command(name), "--steps") is None

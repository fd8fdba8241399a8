"""The request's own checks: what a sampling request may name."""

from __future__ import annotations

import pytest
from diffusers import DDPMScheduler

from denoiser.request import TIMESTEP_SPACINGS, check_timestep_spacing
from denoiser.sampling.loop import make_sampler


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
    from denoiser.request import BUILT_IN, SampleRequest
    from denoiser.sampling.loop import sample
    from denoiser.train.config import TrainConfig

    def command(name):
        parser = build_parser(name)
        return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[name]

    def default(parser, flag):
        return next(a.default for a in parser._actions if flag in a.option_strings)

    assert SampleRequest().num_images == BUILT_IN["num_images"]
    assert inspect.signature(sample).parameters["num_images"].default == BUILT_IN["num_images"]
    assert inspect.signature(sample).parameters["num_inference_steps"].default == BUILT_IN["steps"]
    # the app's engine leaves it unset (None) for Engine.sample_plan to fill from the table (test_app's API test)
    assert inspect.signature(Engine.generate).parameters["num_images"].default is None
    assert default(command("sample"), "--num-images") == BUILT_IN["num_images"]
    stats = command("attention-stats")
    assert default(stats, "--num-images") == BUILT_IN["num_images"]
    assert f"{BUILT_IN['statistics_scheduler']}-{BUILT_IN['statistics_steps']}" in next(
        a.help for a in stats._actions if "--num-images" in a.option_strings)
    assert TrainConfig().sample_steps == BUILT_IN["steps"]
    for name in ("sample", "denoise", "edit"):  # unset: the model folder's own, never a number written in the door
        assert default(command(name), "--steps") is None


def test_the_sampler_table_names_the_classes_the_loop_builds():
    """The sampler names and their diffusers classes are one table (denoiser.request.SCHEDULER_CLASSES, no torch):
    the loop builds each name's class, and a folder's scheduler class reads back as its name."""
    from denoiser.request import SCHEDULER_CLASSES, sampler_name
    from denoiser.sampling.loop import SAMPLERS

    assert {name: s.scheduler.__name__ for name, s in SAMPLERS.items()} == SCHEDULER_CLASSES
    assert [sampler_name(cls) for cls in SCHEDULER_CLASSES.values()] == list(SCHEDULER_CLASSES)
    assert sampler_name("LMSDiscreteScheduler") == "LMSDiscreteScheduler"  # a swapped-in one keeps its own name

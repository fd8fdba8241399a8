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

    from denoiser.app.form import form_request
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
    # the app's form left unset (an API call's None) leaves it to the request's table (test_app's API test)
    assert form_request([], False, num_images=None).num_images == BUILT_IN["num_images"]
    assert default(command("sample"), "--num-images") == BUILT_IN["num_images"]
    stats = command("attention-stats")
    assert default(stats, "--num-images") == BUILT_IN["num_images"]
    assert f"{BUILT_IN['statistics_scheduler']}-{BUILT_IN['statistics_steps']}" in next(
        a.help for a in stats._actions if "--num-images" in a.option_strings)
    assert TrainConfig().sample_steps == BUILT_IN["steps"]
    for name in ("sample", "denoise", "edit"):  # unset: the model folder's own, never a number written in the door
        assert default(command(name), "--steps") is None


def test_the_cli_and_the_app_start_from_one_model_and_measure_heads_at_one_set_of_noise_levels():
    """Issue 70 item 4: `denoiser sample` without --model drew synthetic-shapes while the app opened on cifar10, and
    `denoiser attention-stats` measured the heads at t = 999..30 while the app's Heads tab used 800, 400, 100, 20. Both
    doors now read BUILT_IN: the same model (a shipped one that needs no prompt) and the same noise levels."""
    import argparse
    import inspect

    from denoiser.app.attention_views import AttentionViews
    from denoiser.app.page import Page
    from denoiser.cli.main import DEFAULT_MODEL, build_parser
    from denoiser.evaluate.attention_stats import attention_stats
    from denoiser.folders.model_dir import WEIGHTS_DIR
    from denoiser.request import BUILT_IN

    assert DEFAULT_MODEL is BUILT_IN["model"]
    page = Page.__new__(Page)  # default_model reads only the engine's model list
    for served in (["emoji", "synthetic-shapes", BUILT_IN["model"]], [BUILT_IN["model"]]):
        page.engine = type("Models", (), {"models": lambda self, served=served: served})()
        assert page.default_model == DEFAULT_MODEL
    shipped = WEIGHTS_DIR / DEFAULT_MODEL
    assert (shipped / "unet").is_dir() and not (shipped / "text_encoder").exists(), "a shipped model that needs no prompt"

    timesteps = BUILT_IN["statistics_timesteps"]
    stats = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices["attention-stats"]
    assert next(a.default for a in stats._actions if "--timesteps" in a.option_strings) == ",".join(map(str, timesteps))
    assert inspect.signature(AttentionViews.head_table).parameters["timesteps"].default is timesteps  # the Heads tab
    assert inspect.signature(attention_stats).parameters["timesteps"].default is timesteps

def test_the_sampler_table_names_the_classes_the_loop_builds():
    """The sampler names and their diffusers classes are one table (denoiser.request.SCHEDULER_CLASSES, no torch):
    the loop builds each name's class, and a folder's scheduler class reads back as its name."""
    from denoiser.request import SCHEDULER_CLASSES, sampler_name
    from denoiser.sampling.loop import SAMPLERS

    assert {name: s.scheduler.__name__ for name, s in SAMPLERS.items()} == SCHEDULER_CLASSES
    assert [sampler_name(cls) for cls in SCHEDULER_CLASSES.values()] == list(SCHEDULER_CLASSES)
    assert sampler_name("LMSDiscreteScheduler") == "LMSDiscreteScheduler"  # a swapped-in one keeps its own name

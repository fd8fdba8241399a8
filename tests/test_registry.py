"""denoiser/folders/registry.py: the one name it adds to diffusers, and the diffusers behaviour that makes it needed."""

from __future__ import annotations

import json
import shutil

import diffusers
import pytest
from diffusers import DiffusionPipeline

import denoiser  # noqa: F401  (registers DenoiserPipeline with diffusers)
from denoiser.folders.model_dir import WEIGHTS_DIR
from denoiser.folders.pipeline import DenoiserPipeline
from denoiser.folders.registry import register_with_diffusers

SHAPES = WEIGHTS_DIR / "synthetic-shapes"


def test_diffusers_module_answers_the_name_and_nothing_else_changes():
    register_with_diffusers()  # again: nothing changes
    assert diffusers.DenoiserPipeline is DenoiserPipeline
    assert diffusers.DDIMScheduler.__module__.startswith("diffusers.")  # diffusers' lazy names as before
    with pytest.raises(AttributeError, match="NoSuchPipeline"):
        diffusers.NoSuchPipeline  # noqa: B018


def test_diffusers_finds_the_pipeline_class_by_name_in_its_module():
    # what the registry relies on (diffusers 0.42.1): should diffusers look elsewhere, this fails
    from diffusers.pipelines.pipeline_loading_utils import _get_pipeline_class

    assert _get_pipeline_class(DiffusionPipeline, config={"_class_name": "DenoiserPipeline"}) is DenoiserPipeline


def test_without_the_registry_diffusers_cannot_load_the_folder(monkeypatch):
    # the reason the registry exists; should diffusers find the class by itself, this fails and it can go
    monkeypatch.delitem(vars(diffusers), "__getattr__")
    with pytest.raises(AttributeError, match="DenoiserPipeline"):
        DiffusionPipeline.from_pretrained(SHAPES)


def test_a_library_class_name_is_not_loaded_without_remote_code(tmp_path):
    # the registry's way out: a model_index.json naming [library, class] as its components do; should diffusers
    # load such a folder without trust_remote_code, this fails and the folders can name the class themselves
    folder = tmp_path / "shapes"
    shutil.copytree(SHAPES, folder)
    index = json.loads((folder / "model_index.json").read_text())
    (folder / "model_index.json").write_text(json.dumps({**index, "_class_name": ["denoiser.folders.pipeline", "DenoiserPipeline"]}))
    with pytest.raises((TypeError, AttributeError, ValueError)):
        DiffusionPipeline.from_pretrained(folder)


def test_the_pipeline_class_loads_a_folder_through_diffusers_alone(monkeypatch):
    monkeypatch.delitem(vars(diffusers), "__getattr__")  # no registry
    pipe = DenoiserPipeline.from_pretrained(SHAPES)
    assert type(pipe) is DenoiserPipeline and pipe.classes == ["circle", "square", "triangle", "cross"]

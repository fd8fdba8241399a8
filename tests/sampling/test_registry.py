"""denoiser/sampling/registry.py: the one name it adds to diffusers, and the diffusers behaviour that makes it needed."""

from __future__ import annotations

import json
import shutil

import diffusers
import pytest
from diffusers import DiffusionPipeline

import denoiser  # noqa: F401  (registers DenoiserPipeline with diffusers)
from denoiser.folders.model_dir import WEIGHTS_DIR
from denoiser.sampling.pipeline import DenoiserPipeline
from denoiser.sampling.registry import register_with_diffusers

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
    (folder / "model_index.json").write_text(json.dumps({**index, "_class_name": ["denoiser.sampling.pipeline", "DenoiserPipeline"]}))
    with pytest.raises((TypeError, AttributeError, ValueError)):
        DiffusionPipeline.from_pretrained(folder)


def test_the_pipeline_class_loads_a_folder_through_diffusers_alone(monkeypatch):
    monkeypatch.delitem(vars(diffusers), "__getattr__")  # no registry
    pipe = DenoiserPipeline.from_pretrained(SHAPES)
    assert type(pipe) is DenoiserPipeline and pipe.classes == ["circle", "square", "triangle", "cross"]


def test_folders_that_name_the_modules_before_the_rooms_still_load(tmp_path):
    """Issue 59 moved denoiser/unet.py and text.py into denoiser/model/. A model folder names each component's module
    in model_index.json: the shipped ones now name "denoiser.model.unet" and "denoiser.model.text", as every folder
    written now does; one a person trained before names "denoiser.unet" and "denoiser.text", and still loads through
    diffusers' own from_pretrained (denoiser.sampling.pipeline.MOVED)."""
    import shutil

    from denoiser.model.text import HashTextEncoder
    from denoiser.model.unet import UNet

    for name in ("cifar10", "emoji", "synthetic-shapes"):
        index = json.loads((WEIGHTS_DIR / name / "model_index.json").read_text())
        assert {v[0] for k, v in index.items() if not k.startswith("_") and v[0] != "diffusers"} <= {
            "denoiser.model.unet", "denoiser.model.text"}, (name, index)
    before = shutil.copytree(WEIGHTS_DIR / "emoji", tmp_path / "before")
    index = json.loads((before / "model_index.json").read_text())
    index.update(unet=["denoiser.unet", "UNet"], text_encoder=["denoiser.text", "HashTextEncoder"],
                 tokenizer=["denoiser.text", "WordHashTokenizer"])
    (before / "model_index.json").write_text(json.dumps(index))
    pipe = DiffusionPipeline.from_pretrained(before)
    assert isinstance(pipe.unet, UNet) and isinstance(pipe.text_encoder, HashTextEncoder)
    pipe.save_pretrained(tmp_path / "again")
    assert json.loads((tmp_path / "again" / "model_index.json").read_text())["unet"][0] == "denoiser.model.unet"
    assert isinstance(DiffusionPipeline.from_pretrained(tmp_path / "again").unet, UNet)

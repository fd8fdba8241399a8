"""`denoiser evaluate` on a text model: the held-out bound given each image's prompt (--prompts FILE, line k for
image k, or --prompt for all), equal to Diffusion.evaluate with the encoded prompts; without prompts it says how."""

from __future__ import annotations

import json

import pytest
import torch
from PIL import Image

from denoiser.cli.main import main
from denoiser.data import DataConfig, load_dataset
from denoiser.diffusion import Diffusion
from denoiser.folders.model_dir import load_model, load_text
from denoiser.model.text import encode_prompts
from tests.conftest import random_text_model

PROMPTS = ["red apple", "blue car", "", "a very sad cat"]


@pytest.fixture(scope="module")
def text_model(tmp_path_factory):
    return random_text_model(tmp_path_factory.mktemp("text") / "model")


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    root = tmp_path_factory.mktemp("imgs")
    for cls in ("a", "b"):
        (root / cls).mkdir()
        for i in range(2):
            Image.new("RGB", (20, 20), (60 * i, 90, 200 - 50 * i)).save(root / cls / f"{i}.png")
    return root


def _evaluate(model, images, capsys, *flags) -> dict:
    assert main(["evaluate", "--model", str(model), "--data", str(images), "--num-images", "4", "--num-timesteps", "4",
                 *flags]) == 0
    return json.loads(capsys.readouterr().out)


def test_bound_is_conditioned_on_each_images_prompt(text_model, images, tmp_path, capsys):
    (tmp_path / "p.txt").write_text("\n".join(p or " " for p in PROMPTS[:2]) + "\n")  # 2 lines, cycled over 4 images
    res = _evaluate(text_model, images, capsys, "--prompts", str(tmp_path / "p.txt"))

    unet, sched = load_model(text_model)
    x, _ = load_dataset(DataConfig(dataset="folder", path=str(images)), unet.config.sample_size).batch(torch.arange(4))
    text = load_text(text_model)
    states, mask = encode_prompts(text.tokenizer, text.encoder, [PROMPTS[k % 2] for k in range(4)])
    direct = Diffusion(sched).evaluate(unet, x, num_timesteps=4,
                                       unet_kwargs={"encoder_hidden_states": states, "encoder_attention_mask": mask.bool()})
    assert res["bits_per_dim"] == pytest.approx(direct.bits_per_dim, rel=1e-6)

    # the prompt reaches the bound: the same images with no condition ("") score otherwise
    empty = _evaluate(text_model, images, capsys, "--prompt", "")
    assert abs(empty["bits_per_dim"] - res["bits_per_dim"]) > 1e-4
    bare = Diffusion(sched).evaluate(unet, x, num_timesteps=4)  # no encoder states at all = the empty prompt
    assert empty["bits_per_dim"] == pytest.approx(bare.bits_per_dim, rel=1e-6)


def test_a_text_models_bound_asks_for_prompts(text_model, images, capsys):
    assert main(["evaluate", "--model", str(text_model), "--data", str(images), "--num-images", "2",
                 "--num-timesteps", "2"]) == 2
    assert "--prompts FILE" in capsys.readouterr().err


def test_unet_kwargs_need_one_row_per_image(text_model):
    unet, sched = load_model(text_model)
    with pytest.raises(ValueError, match="one per image"):
        Diffusion(sched).evaluate(unet, torch.zeros(3, 3, 16, 16), num_timesteps=2,
                                  unet_kwargs={"encoder_hidden_states": torch.zeros(2, 1, 12)})


def test_a_text_model_folder_without_its_encoder_is_named(text_model, images, tmp_path, capsys):
    import shutil

    bare = tmp_path / "no-encoder"
    shutil.copytree(text_model, bare)
    shutil.rmtree(bare / "text_encoder")
    assert main(["evaluate", "--model", str(bare), "--data", str(images), "--num-images", "2", "--num-timesteps", "2",
                 "--prompt", "red apple"]) == 2
    err = capsys.readouterr().err
    assert "'no-encoder'" in err and "no text encoder was found" in err and "text_encoder/, tokenizer/" in err

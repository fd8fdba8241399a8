"""Edit and inpaint with a text model's prompt (denoiser.restore.chains's `text`): the prompt steers the redrawn pixels,
the empty prompt is the unconditioned run, the known pixels stay; the CLI's --prompt, the app engine's prompt."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from denoiser.app.engine import Engine
from denoiser.cli.main import main
from denoiser.diffusion import Diffusion
from denoiser.folders.model_dir import WEIGHTS_DIR, load_model, load_text
from denoiser.restore.chains import restore
from denoiser.sampling.guidance import Guidance, TextCondition
from tests.conftest import random_text_model

PHOTO = Image.new("RGB", (40, 30), (200, 60, 40))


@pytest.fixture(scope="module")
def text_model(tmp_path_factory):
    return random_text_model(tmp_path_factory.mktemp("weights") / "words")


def _restore(folder, operation, prompt, guidance=None, **kw):
    unet, sched = load_model(folder)
    text = None if prompt is None else TextCondition.encode(load_text(folder).tokenizer, load_text(folder).encoder, [prompt])
    return restore(unet, Diffusion(sched), PHOTO, operation, steps=4, seed=3, text=text, guidance=guidance, **kw).result.images


def test_a_prompt_steers_an_edit_and_the_empty_prompt_is_no_condition(text_model):
    bare = _restore(text_model, "edit", None, strength=0.7)
    assert (_restore(text_model, "edit", "red apple", strength=0.7) - bare).abs().max() > 1e-3
    torch.testing.assert_close(_restore(text_model, "edit", "", strength=0.7), bare, rtol=0, atol=1e-5)
    guided = _restore(text_model, "edit", "red apple", Guidance(scale=3.0), strength=0.7)  # CFG from "" to the prompt
    assert (guided - _restore(text_model, "edit", "red apple", strength=0.7)).abs().max() > 1e-3


def test_inpainting_with_a_prompt_keeps_the_known_pixels(text_model):
    mask = Image.new("L", PHOTO.size, 0)
    mask.paste(255, (10, 5, 30, 25))
    out = _restore(text_model, "inpaint", "blue car", mask=mask)
    unet, _ = load_model(text_model)
    S = unet.config.sample_size
    known = torch.from_numpy(np.array(PHOTO.resize((S, S)))).permute(2, 0, 1).float() / 255  # one colour: any resize
    assert (out[0, :, 0, :] - known[:, 0, :]).abs().max() < 2 / 255  # the top row is outside the hole
    other = _restore(text_model, "inpaint", "red apple", mask=mask)
    assert (other - out).abs().max() > 1e-3  # the hole follows the prompt


def test_cli_edit_takes_a_prompt_and_a_class_model_refuses_one(text_model, tmp_path, capsys):
    PHOTO.save(tmp_path / "photo.png")
    outs = []
    for flags in ([], ["--prompt", "red apple"]):
        out = tmp_path / f"edit{len(flags)}.png"
        assert main(["edit", "--model", str(text_model), "--image", str(tmp_path / "photo.png"), "--out", str(out),
                     "--steps", "4", "--strength", "0.7", *flags]) == 0
        outs.append(np.asarray(Image.open(out), dtype=np.int16))
    assert np.abs(outs[0] - outs[1]).max() > 2
    with pytest.raises(SystemExit):  # denoise keeps what the picture shows: no --prompt flag
        main(["denoise", "--model", str(text_model), "--image", str(tmp_path / "photo.png"), "--out", str(out),
              "--prompt", "x"])
    capsys.readouterr()
    assert main(["edit", "--model", str(WEIGHTS_DIR / "synthetic-shapes"), "--image", str(tmp_path / "photo.png"),
                 "--out", str(out), "--steps", "2", "--prompt", "red apple"]) == 2
    assert "this model takes no prompt" in capsys.readouterr().err


def test_the_engine_edits_toward_a_prompt_and_its_words_have_maps(text_model):
    ex = Engine(text_model.parent)
    gen, done = ex.restore("words", ex.restore_request("edit", guidance_scale=2.0, strength=0.7, steps=4, seed=3,
                                                       prompt="red apple"), PHOTO)
    assert gen.words == ("red", "apple") and gen.prompt == "red apple" and done.steps == gen.num_steps
    maps = ex.views.word_maps(gen, 0, gen.num_steps - 1, 1)  # "apple" at the last step, in every cross-attention layer
    assert maps and all(torch.isfinite(w).all() for _, w in maps)
    bare, _ = ex.restore("words", ex.restore_request("edit", strength=0.7, steps=4, seed=3), PHOTO)
    assert not bare.words and (bare.images - gen.images).abs().max() > 1e-3
    with pytest.raises(ValueError, match="denoise removes the noise and keeps what your picture shows"):
        ex.restore_request("denoise (sampled)", steps=4, prompt="red apple")
    with pytest.raises(ValueError, match="give a prompt"):
        ex.restore("words", ex.restore_request("edit", guidance_scale=2.0, strength=0.5, steps=4), PHOTO)

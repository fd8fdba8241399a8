"""`denoiser attention` on a text model: --word draws a prompt word's map at every cross-attention layer, --pixel
adds the pixel's weights over the prompt's words; the errors say what to pass instead."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from diffusers import DDPMScheduler
from PIL import Image

from denoiser.cli.main import main
from denoiser.model.text import WordHashTokenizer, find_word
from denoiser.pictures import overlay, token_weights, word_maps, word_maps_panel
from denoiser.pixels import to_uint8
from denoiser.request import SampleRequest
from denoiser.sampling.pipeline import save_pipeline
from denoiser.sampling.plan import resolve, run
from tests.conftest import random_text_model

D = 12  # the text encoder's width = the UNet's cross_attention_dim
CROSS_LAYERS = ["down.1.cross.0", "mid_cross", "up.0.cross.0", "up.0.cross.1"]  # TINY's, in call order


@pytest.fixture(scope="module")
def text_model(tmp_path_factory):
    return random_text_model(tmp_path_factory.mktemp("text") / "model", D)


@pytest.fixture(scope="module")
def captured(text_model):
    """The last step's image and attention of "Red apple" (2 DDIM steps), as the command samples it."""
    plan = resolve(SampleRequest(num_images=1, prompts="Red apple", steps=2), text_model)
    res = run(plan, capture_steps=[1])
    return res.images[0], res.attention[1]


def _attention(model, *flags) -> list[str]:
    return ["attention", "--model", str(model), "--steps", "2", *flags]


def test_word_writes_one_map_per_cross_attention_layer(text_model, captured, tmp_path, capsys):
    out = tmp_path / "apple.png"
    assert main(_attention(text_model, "--prompt", "Red apple", "--word", "APPLE", "--out", str(out))) == 0
    assert "4 cross-attention layers" in capsys.readouterr().out
    image, records = captured
    want = word_maps_panel(image, records, 1, "apple")  # the words' order: red, apple
    got = Image.open(out).convert("RGB")
    assert got.size == want.size == (3 * (128 + 4) + 4, want.height)  # image + down.1 + mid; image + the 2 up layers
    assert got.tobytes() == want.tobytes()


def test_word_maps_are_the_records_token_maps(captured):
    image, records = captured
    cross = [r for r in records if r.kind == "cross"]
    assert [r.name for r in cross] == CROSS_LAYERS
    maps = word_maps(records, 1)
    assert [label.split(" ")[0] for label, _ in maps] == CROSS_LAYERS
    for rec, (_, m) in zip(cross, maps):
        # float64 from the captured q and k: each pixel's softmax over the 2 words, word 1's column, mean of heads
        q, k = rec.q[0].double(), rec.k[0].double()  # (h, N, d), (h, L, d)
        ref = torch.softmax(q @ k.transpose(-2, -1) * rec.scale, -1)[..., 1].mean(0).reshape(rec.size)  # (H, W)
        torch.testing.assert_close(m.double(), ref, rtol=1e-5, atol=1e-6)
        assert m.argmax() == rec.token_map(1)[0].mean(0).argmax()
    red = word_maps(records, 0)
    for (_, a), (_, r) in zip(maps, red):  # the two words share every pixel's attention
        torch.testing.assert_close(a + r, torch.ones_like(a))


def test_word_panel_draws_each_map_over_the_image(captured):
    """Each layer's tile is the record's map on the one absolute scale (issue 60 item 5), blended over the image: find it
    in the panel."""
    image, records = captured
    panel = np.asarray(word_maps_panel(image, records, 1, "apple"))
    scale, pad = 128 // 16, 4
    for c, (_, m) in enumerate(word_maps(records, 1)[:2], start=1):  # the first row: down.1.cross.0, mid_cross
        tile = to_uint8(overlay(image, m, vmax=1.0)).permute(1, 2, 0).numpy()  # (16, 16, 3)
        tile = tile.repeat(scale, 0).repeat(scale, 1)  # (128, 128, 3): nearest upscale
        x0 = pad + c * (128 + pad)
        found = [y for y in range(panel.shape[0] - 128) if (panel[y : y + 128, x0 : x0 + 128] == tile).all()]
        assert found, f"layer {c}'s map is not drawn in column {c}"


def test_pixel_on_a_text_model_adds_its_weights_over_the_words(text_model, captured, tmp_path, capsys):
    out = tmp_path / "pixel.png"
    assert main(_attention(text_model, "--prompt", "Red apple", "--pixel", "3,12", "--out", str(out))) == 0
    printed = capsys.readouterr().out
    assert "(4 layers" in printed and "pixel-words.png" in printed  # the 4 self-attention layers; the words' chart
    assert Image.open(tmp_path / "pixel-words.png").width > 300
    _, records = captured
    weights = token_weights(records, (3, 12), 16)
    assert [label.split(" ")[0] for label, _ in weights] == CROSS_LAYERS
    for rec, (_, w) in zip([r for r in records if r.kind == "cross"], weights):
        H, W = rec.size
        torch.testing.assert_close(w, rec.weights((3 * H // 16, 12 * W // 16))[0].mean(0))
        torch.testing.assert_close(w.sum(), torch.tensor(1.0))


def test_every_step_draws_a_row_per_step(text_model, tmp_path):
    heights = []
    for steps in ("2", "3"):
        out = tmp_path / f"every{steps}.png"
        assert main(["attention", "--model", str(text_model), "--steps", steps, "--prompt", "red apple", "--word", "red",
                     "--every-step", "--out", str(out)]) == 0
        assert Image.open(out).width == 5 * (16 * 6 + 4) + 4  # 96-pixel tiles: the step's x0 + the 4 layers
        heights.append(Image.open(out).height)
    assert 96 < heights[1] - heights[0] < 2 * 96  # one more step: one more row


@pytest.mark.parametrize("flags, message", [
    (["--prompt", "red apple", "--word", "pear"], "'pear' is not a word of the prompt; pick one of its words: red, apple"),
    (["--word", "apple"], '--prompt "red apple" --word apple'),
    (["--prompt", "red apple"], "one of: --pixel Y,X"),
    (["--prompt", "red apple", "--word", "red", "--pixel", "1,1"], "one of: --pixel Y,X"),
    (["--prompt", "red apple", "--pixel", "1,1", "--every-step"], "give --word"),
])
def test_errors_name_the_fix(text_model, tmp_path, capsys, flags, message):
    assert main(_attention(text_model, *flags, "--out", str(tmp_path / "x.png"))) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "x.png").exists()


def test_word_on_a_class_model_says_to_use_pixel(tiny_unet, tmp_path, capsys):
    model = save_pipeline(tiny_unet, DDPMScheduler(), tmp_path / "m")
    assert main(_attention(model, "--word", "apple", "--out", str(tmp_path / "x.png"))) == 2
    assert "this model takes no text (it has no cross-attention): use --pixel Y,X" in capsys.readouterr().err


def test_find_word_normalises_as_the_tokenizer():
    words = WordHashTokenizer().tokens("Red  Café apple!")
    assert words == ["red", "cafe", "apple"]
    assert find_word(words, "CAFÉ") == 1 and find_word(words, "apple") == 2
    with pytest.raises(ValueError, match="pick one of its words: red, cafe, apple"):
        find_word(words, "red apple")

"""One way to restore (denoiser/restore/plan.py, issue 52 item 1; the chains under it are
tests/restore/test_chains.py's): one request, one rule for tiles or the centre square, the class and guidance reaching
the tiles, the same pixels from the CLI and the app, the defaults written once, and every model load and prompt encoding
counted."""

from __future__ import annotations

import pytest
import torch
from diffusers import DDPMScheduler
from PIL import Image
from torchvision.transforms.functional import pil_to_tensor

from denoiser.app.engine import Engine
from denoiser.cli.main import main
from denoiser.diffusion import Diffusion
from denoiser.folders.model_dir import load
from denoiser.request import ADDED_NOISE_SEED, BUILT_IN, GuidanceRequest, RestoreRequest, SampleRequest
from denoiser.restore.chains import restore, with_noise
from denoiser.restore.plan import check_request, resolve_restore, run_restore
from denoiser.restore.tiles import denoise_photo
from denoiser.sampling.guidance import Guidance
from denoiser.sampling.loop import image_generators
from denoiser.sampling.pipeline import save_pipeline
from tests.conftest import random_text_model


def _photo(width: int, height: int, seed: int = 0) -> Image.Image:
    g = torch.Generator().manual_seed(seed)
    coarse = torch.rand((1, 3, height // 10 + 2, width // 10 + 2), generator=g)
    smooth = torch.nn.functional.interpolate(coarse, size=(height, width), mode="bilinear")[0]
    noisy = (smooth + 0.05 * torch.randn(smooth.shape, generator=g)).clamp(0, 1).mul(255).round().byte()
    return Image.fromarray(noisy.permute(1, 2, 0).numpy())  # (3, H, W) -> (H, W, 3)


@pytest.fixture
def class_folder(tmp_path, class_unet):
    """A served folder of model folders holding one class model ("model", 3 named classes, 16x16)."""
    save_pipeline(class_unet, DDPMScheduler(clip_sample=True), tmp_path / "w" / "model", classes=["red", "green", "blue"])
    return tmp_path / "w"


def test_the_cli_and_the_app_give_the_same_pixels_for_one_request(tmp_path, class_folder, capsys):
    """Issue 52: a tiled denoise with noise added first and a class with guidance, at a size that is not the model's,
    gives the same pixels from `denoiser denoise` and the app's engine (before: the app worked on the centre square
    once noise was added, and its tiles dropped the class and guidance its PNG recorded)."""
    photo = _photo(45, 70)
    path = tmp_path / "photo.png"
    photo.save(path)
    assert main(["denoise", "--model", str(class_folder / "model"), "--image", str(path), "--out", str(tmp_path / "cli.png"),
                 "--add-noise", "0.1", "--seed", "3", "--class-label", "green", "--guidance", "2"]) == 0
    ex = Engine(class_folder)
    gen, done = ex.restore("model", ex.restore_request("denoise", class_label=1, guidance_scale=2.0, add_noise=0.1, seed=3),
                           Image.open(path))
    assert gen is None and done.image.size == (45, 70)  # the photo's own size, noise added first or not
    cli = pil_to_tensor(Image.open(tmp_path / "cli.png"))
    assert torch.equal(cli, pil_to_tensor(done.image))
    # and both are the tiles' own denoise with that class and guidance, and differ from the unguided one
    model = load(class_folder / "model")
    want = denoise_photo(model.unet, model.noise_schedule, pil_to_tensor(photo), 0.1, add_noise=0.1, seed=3, class_label=1,
                         guidance=Guidance(scale=2.0))
    assert torch.equal(cli, want.result)
    plain = denoise_photo(model.unet, model.noise_schedule, pil_to_tensor(photo), 0.1, add_noise=0.1, seed=3)
    assert not torch.equal(cli, plain.result)
    assert done.settings | {"class": "green", "guidance_scale": 2.0, "add_noise": 0.1, "chain": False} == done.settings
    assert f"noisy {done.psnr[0]:.2f} dB, result {done.psnr[1]:.2f} dB" in capsys.readouterr().out


def test_the_added_noise_follows_the_seed_rule_in_tiles_and_on_the_square(class_folder):
    """The noise a restore adds first is image 0's of the generators seeded seed + ADDED_NOISE_SEED, whether it goes
    onto the whole photo (tiles, quantised as a camera writes it) or the square (before: tiles drew their own)."""
    model, photo = load(class_folder / "model"), _photo(16, 16)
    tiled = run_restore(resolve_restore(RestoreRequest("denoise", add_noise=0.2, seed=4), model, photo))
    x = pil_to_tensor(photo)[None].float() / 127.5 - 1  # (1, 3, 16, 16) in [-1, 1]
    noise = torch.randn((1, 3, 16, 16), generator=image_generators(4 + ADDED_NOISE_SEED, [0])[0])
    want = (x / 2 + 0.5 + 0.2 * noise).clamp(0, 1).mul(255).round().byte()[0]
    assert (pil_to_tensor(tiled.noisy).int() - want.int()).abs().max() <= 1  # float rounding at most
    assert torch.equal(with_noise(x, 0.2, 4), x + 0.4 * noise)


def test_one_rule_decides_tiles_or_the_centre_square(class_folder):
    """A one-step denoise keeps the photo's size whatever it is (the model's own included); the chains work on the
    centre square at the model's size."""
    model = load(class_folder / "model")
    wide = _photo(40, 24)
    for request, size, tiled in ((RestoreRequest("denoise", sigma=0.1), (40, 24), True),
                                 (RestoreRequest("denoise", sigma=0.1, add_noise=0.1), (40, 24), True),
                                 (RestoreRequest("denoise", method="sample", sigma=0.1, steps=3), (16, 16), False),
                                 (RestoreRequest("edit", strength=0.5, steps=4), (16, 16), False)):
        plan = resolve_restore(request, model, wide)
        done = run_restore(plan)
        assert (plan.tiled, done.image.size, done.settings["chain"]) == (tiled, size, not tiled)
        assert (done.sample is None) == tiled and done.input.size == size
    square = _photo(16, 16)  # at the model's size the tiles are one tile: the one-step denoise of the square
    done = run_restore(resolve_restore(RestoreRequest("denoise", sigma=0.1), model, square))
    direct = restore(model.unet, Diffusion(model.noise_schedule), square, "denoise", sigma=0.1)
    assert (pil_to_tensor(done.image).int() - (direct.result.images[0] * 255).round().int()).abs().max() <= 1


def test_the_defaults_are_written_once_and_bad_requests_are_refused_before_work():
    filled = check_request(RestoreRequest("edit"))
    assert (filled.steps, filled.strength) == (BUILT_IN["steps"], BUILT_IN["strength"])
    assert check_request(RestoreRequest("denoise", add_noise=0.1)).sigma == 0.1  # the σ added is the σ removed
    assert check_request(RestoreRequest("denoise")).sigma is None  # else estimated
    for bad, match in ((dict(operation="blur"), "operation must be one of"), (dict(operation="denoise", method="x"),
                       "method must be"), (dict(operation="edit", strength=0.0), "edit strength 0"),
                       (dict(operation="denoise", prompts="red apple"), "a prompt steers edit and inpaint"),
                       (dict(operation="edit", steps=0), "steps must be a whole number"),
                       (dict(operation="denoise", add_noise=float("nan")), "added noise σ must be")):
        with pytest.raises(ValueError, match=match):
            check_request(RestoreRequest(**bad))
    with pytest.raises(TypeError, match="RestoreRequest"):
        check_request({"operation": "edit"})


def test_a_generate_loads_each_model_once_and_encodes_its_prompt_once(tmp_path, monkeypatch):
    """Issue 52 item 2: one Generate (and one Edit run) of a text model loads its UNet and text encoder once for the
    app's life, not per request, and encodes its prompt once (before: the encoder reloaded from disk and the prompt
    was encoded twice per Generate)."""
    from denoiser.model.text import HashTextEncoder
    from denoiser.model.unet import UNet
    from denoiser.sampling.guidance import TextCondition

    random_text_model(tmp_path / "w" / "words")
    counts = {"unet": 0, "encoder": 0, "encode": 0}

    def counted(name, original):
        def call(*args, **kwargs):
            counts[name] += 1
            return original(*args, **kwargs)

        return call

    monkeypatch.setattr(UNet, "from_pretrained", counted("unet", UNet.from_pretrained))
    monkeypatch.setattr(HashTextEncoder, "from_pretrained", counted("encoder", HashTextEncoder.from_pretrained))
    monkeypatch.setattr(TextCondition, "encode", counted("encode", TextCondition.encode))
    ex = Engine(tmp_path / "w")
    ex.generate("words", SampleRequest(steps=2, num_images=2, prompts="red apple", guidance=GuidanceRequest(guidance_scale=2.0)))
    assert counts == {"unet": 1, "encoder": 1, "encode": 1}
    ex.generate("words", SampleRequest(steps=2, num_images=2, prompts="blue car", guidance=GuidanceRequest(guidance_scale=2.0)))
    assert counts == {"unet": 1, "encoder": 1, "encode": 2}  # the second: no load, one encoding
    ex.restore("words", ex.restore_request("edit", steps=2, prompt="red apple", guidance_scale=2.0), _photo(16, 16))
    assert counts == {"unet": 1, "encoder": 1, "encode": 3}

"""Denoising a photo of any size in overlapping tiles (denoiser.restore.tiles), against restore.denoise on one tile."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from diffusers import DDPMScheduler
from PIL import Image

from denoiser.diffusion import Diffusion
from denoiser.restore.chains import denoise
from denoiser.restore.tiles import StopTiling, TileOptions, blend_window, denoise_tiles, photo_sigma, tile_starts


@pytest.fixture
def diffusion():
    return Diffusion(DDPMScheduler(clip_sample=True))


def _photo(h: int, w: int, seed: int = 0) -> torch.Tensor:
    """A smooth (3, H, W) uint8 picture with noise on it."""
    g = torch.Generator().manual_seed(seed)
    coarse = torch.rand((1, 3, h // 8 + 1, w // 8 + 1), generator=g)
    smooth = torch.nn.functional.interpolate(coarse, size=(h, w), mode="bilinear", align_corners=False)[0]
    noisy = smooth + 0.1 * torch.randn(smooth.shape, generator=g)
    return (noisy.clamp(0, 1) * 255).round().to(torch.uint8)


def _reference(unet, diffusion, crop: torch.Tensor, sigma: float) -> torch.Tensor:
    """restore.denoise (one-step MMSE through the sampling loop) of one model-size crop, as uint8-scale floats."""
    return denoise(unet, diffusion, crop[None].float() / 127.5 - 1, sigma=sigma).images[0] * 255


def test_tiles_cover_the_length_and_end_on_it():
    assert tile_starts(16, 16, 12) == [0]
    assert tile_starts(40, 16, 12) == [0, 12, 24]
    assert tile_starts(41, 16, 12) == [0, 12, 24, 25]
    for length in (16, 17, 50, 113):
        starts = tile_starts(length, 16, 10)
        assert starts[-1] + 16 == length and all(b - a <= 10 for a, b in zip(starts, starts[1:]))


def test_windows_fade_towards_the_edges_and_never_reach_zero():
    for kind in ("cosine", "linear"):
        w = blend_window(16, 4, kind)
        assert w.shape == (16, 16) and float(w.min()) > 0 and float(w[4:12, 4:12].min()) == 1.0
        assert torch.equal(w, w.flip(0)) and torch.equal(w, w.T)
        assert float(w[0, 8]) < float(w[1, 8]) < float(w[3, 8]) < 1.0
    assert torch.equal(blend_window(16, 4, "flat"), torch.ones(16, 16))
    with pytest.raises(ValueError, match="window must be one of"):
        blend_window(16, 4, "hann")


def test_one_tile_is_the_one_step_denoise(tiny_unet, diffusion):
    photo = _photo(16, 16)
    out = denoise_tiles(tiny_unet, diffusion, photo, sigma=0.1)
    assert out.dtype == torch.uint8 and out.shape == (3, 16, 16)
    assert float((out.float() - _reference(tiny_unet, diffusion, photo, 0.1)).abs().max()) <= 0.5 + 1e-3  # rounding


def test_a_larger_photo_keeps_its_size_and_each_tile_its_own_inside(tiny_unet, diffusion):
    """Where only one tile covers a pixel (window 1), the result is that tile's own denoise; the overlaps blend."""
    photo = _photo(37, 53, seed=1)  # awkward sizes: the last tiles overlap more
    out = denoise_tiles(tiny_unet, diffusion, photo, sigma=0.1, options=TileOptions(overlap=4, batch_size=5))
    assert out.shape == photo.shape
    first = _reference(tiny_unet, diffusion, photo[:, :16, :16], 0.1)
    assert float((out[:, 4:12, 4:12].float() - first[:, 4:12, 4:12]).abs().max()) <= 0.5 + 1e-3
    # the batch size changes nothing; no tiling at all is another result at the tile borders
    same = denoise_tiles(tiny_unet, diffusion, photo, sigma=0.1, options=TileOptions(overlap=4, batch_size=64))
    assert torch.equal(out, same)


def test_blending_leaves_no_seam_on_a_flat_photo(tiny_unet, diffusion):
    """A flat grey photo: the blended result across a tile border changes no more than inside a tile."""
    photo = torch.full((3, 16, 40), 128, dtype=torch.uint8)
    out = denoise_tiles(tiny_unet, diffusion, photo, sigma=0.05, options=TileOptions(overlap=8)).float()
    steps = (out[:, :, 1:] - out[:, :, :-1]).abs().amax(dim=(0, 1))  # (W - 1,) largest jump between columns
    one_tile = _reference(tiny_unet, diffusion, photo[:, :, :16], 0.05)
    inside = (one_tile[:, :, 1:] - one_tile[:, :, :-1]).abs().amax(dim=(0, 1))
    assert float(steps.max()) <= float(inside.max()) + 1.0


def test_a_photo_smaller_than_a_tile_is_padded_and_cropped_back(tiny_unet, diffusion):
    photo = _photo(9, 30)
    out = denoise_tiles(tiny_unet, diffusion, photo, sigma=0.1)
    assert out.shape == (3, 9, 30)


def test_progress_counts_every_tile_and_stop_ends_the_work(tiny_unet, diffusion):
    photo = _photo(40, 40)
    seen = []
    denoise_tiles(tiny_unet, diffusion, photo, sigma=0.1, options=TileOptions(overlap=4, batch_size=4),
                  progress=lambda done, total: seen.append((done, total)))
    assert seen[-1] == (9, 9) and [d for d, _ in seen] == [4, 8, 9]
    calls = []
    with pytest.raises(StopTiling, match="stopped after 4 of 9 tiles"):
        denoise_tiles(tiny_unet, diffusion, photo, sigma=0.1, options=TileOptions(overlap=4, batch_size=4),
                      should_stop=lambda: calls.append(1) or len(calls) > 1)


@pytest.mark.parametrize("options, message", [
    (TileOptions(overlap=9), "overlap must be in 0..8"),
    (TileOptions(tile=15), "tile must be a positive multiple of 2"),
    (TileOptions(window="box"), "window must be one of"),
    (TileOptions(batch_size=0), "batch_size must be at least 1"),
])
def test_bad_options_are_refused_before_any_work(tiny_unet, diffusion, options, message):
    with pytest.raises(ValueError, match=message):
        denoise_tiles(tiny_unet, diffusion, _photo(16, 16), sigma=0.1, options=options)
    with pytest.raises(ValueError, match="uint8 tensor"):
        denoise_tiles(tiny_unet, diffusion, _photo(16, 16).float(), sigma=0.1)


def test_cli_denoise_returns_the_photo_at_its_own_size(tmp_path, tiny_unet, capsys):
    """Issue 35 item 15: `denoiser denoise --image photo.png --sigma S --out out.png` keeps the photo's size."""
    from denoiser.cli.main import main
    from denoiser.sampling.pipeline import save_pipeline

    save_pipeline(tiny_unet, DDPMScheduler(clip_sample=True), tmp_path / "model")
    photo = tmp_path / "photo.png"
    Image.fromarray(_photo(45, 70).permute(1, 2, 0).numpy()).save(photo)
    out, compare = tmp_path / "out.png", tmp_path / "compare.png"
    assert main(["denoise", "--model", str(tmp_path / "model"), "--image", str(photo), "--sigma", "0.1", "--out", str(out),
                 "--add-noise", "0.1", "--compare", str(compare)]) == 0
    text = capsys.readouterr().out
    assert Image.open(out).size == (70, 45) and Image.open(compare).size == (3 * 70, 45)
    assert "70x45 at its own size" in text and "PSNR vs the clean input" in text


def test_cli_denoise_of_a_phone_jpeg_keeps_every_pixel(tmp_path, tiny_unet, capsys):
    """Issue 58 item 5: a 4:3 phone JPEG stored sideways (EXIF orientation 6) comes back upright at its own size; the
    CLI decoded it in Pillow's draft mode at 1/8 of its size and still said "at its own size"."""
    import io

    from denoiser.cli.main import main
    from denoiser.sampling.pipeline import save_pipeline
    from tests.test_image_io import _photo as phone_jpeg

    save_pipeline(tiny_unet, DDPMScheduler(clip_sample=True), tmp_path / "model")
    photo = tmp_path / "phone.jpg"
    photo.write_bytes(phone_jpeg(1024, 768, orientation=6))  # stored 1024x768, shown 768x1024
    assert Image.open(io.BytesIO(photo.read_bytes())).size == (1024, 768)
    out = tmp_path / "out.png"
    assert main(["denoise", "--model", str(tmp_path / "model"), "--image", str(photo), "--sigma", "0.05",
                 "--out", str(out)]) == 0
    assert Image.open(out).size == (768, 1024)
    text = capsys.readouterr().out
    assert "768x1024 at its own size" in text and ("float32" in text or "bfloat16" in text)


def test_one_tile_with_a_class_and_guidance_is_the_guided_one_step_denoise(class_unet, diffusion):
    """The tiles take the class and guidance as sampling does (the CLI's plan), and refuse a class the model lacks."""
    from denoiser.sampling.guidance import Guidance

    photo = _photo(16, 16)
    guidance = Guidance(scale=2.0, pag_scale=1.0)
    out = denoise_tiles(class_unet, diffusion, photo, sigma=0.1, class_label=2, guidance=guidance)
    ref = denoise(class_unet, diffusion, photo[None].float() / 127.5 - 1, sigma=0.1, class_label=2, guidance=guidance)
    assert float((out.float() - ref.images[0] * 255).abs().max()) <= 0.5 + 1e-3  # rounding
    assert not torch.equal(out, denoise_tiles(class_unet, diffusion, photo, sigma=0.1, class_label=2))
    with pytest.raises(ValueError, match=r"class 3 is out of range: this model has 3 classes \(0..2\)"):
        denoise_tiles(class_unet, diffusion, photo, sigma=0.1, class_label=3)


def test_cli_denoise_of_a_photo_takes_class_names_and_refuses_unknown_ones(tmp_path, class_unet, capsys):
    from denoiser.cli.main import main
    from denoiser.sampling.pipeline import save_pipeline

    save_pipeline(class_unet, DDPMScheduler(clip_sample=True), tmp_path / "model", classes=["red", "green", "blue"])
    photo = tmp_path / "photo.png"
    Image.fromarray(_photo(20, 40).permute(1, 2, 0).numpy()).save(photo)
    args = ["denoise", "--model", str(tmp_path / "model"), "--image", str(photo), "--sigma", "0.1"]
    assert main([*args, "--out", str(tmp_path / "a.png"), "--class-label", "blue"]) == 0
    assert Image.open(tmp_path / "a.png").size == (40, 20)
    assert main([*args, "--out", str(tmp_path / "b.png"), "--class-label", "circle"]) == 2
    assert "unknown class 'circle'" in capsys.readouterr().err and not (tmp_path / "b.png").exists()


def test_denoise_photo_reports_its_sigma_and_fills_the_buffer_it_is_given(tiny_unet):
    """Issue 41 item 11: the σ estimated is returned (the app shows it); `out` is filled band by band, so a progress
    callback sees the finished rows over the photo (the app's live preview), and the result is the same."""
    from denoiser.restore.tiles import denoise_photo

    sched = DDPMScheduler(clip_sample=True)
    photo = _photo(40, 56)
    plain = denoise_photo(tiny_unet, sched, photo, options=TileOptions(batch_size=3))
    assert plain.sigma == photo_sigma(photo) > 0.05
    out, seen = photo.clone(), []
    given = denoise_photo(tiny_unet, sched, photo, options=TileOptions(batch_size=3), out=out,
                          progress=lambda done, total: seen.append(torch.equal(out, photo)))
    assert given.result is out and torch.equal(out, plain.result)
    assert seen[0] and not seen[-1]  # untouched before the first band is finished, the result at the end
    noisy = denoise_photo(tiny_unet, sched, photo, add_noise=0.2, seed=1)
    assert noisy.sigma == photo_sigma(noisy.noisy) > plain.sigma  # estimated on what it denoised
    with pytest.raises(ValueError, match="out must be a"):
        denoise_photo(tiny_unet, sched, photo, out=torch.zeros(3, 8, 8, dtype=torch.uint8))


def test_a_cameras_grain_is_read_at_its_own_sigma():
    """Issue 60 item 10: grain of about 10/255 on a phone JPEG was read as 3.0-4.4/255 (the finest wavelet band holds
    little of a camera's correlated noise), so the denoise left most of it. photo_sigma reads the 2x2 means' band too."""
    import io

    from denoiser.restore.chains import estimate_sigma
    from denoiser.restore.tiles import photo_sigma

    g = torch.Generator().manual_seed(0)
    smooth = torch.nn.functional.interpolate(torch.rand(1, 3, 9, 9, generator=g), size=(384, 384), mode="bicubic")[0]
    kernel = torch.exp(-torch.arange(-3, 4.0) ** 2 / (2 * 0.8**2))
    kernel = (kernel[:, None] * kernel[None, :] / kernel.sum() ** 2)[None, None]  # (1, 1, 7, 7), sums to 1
    for kind in ("white", "grain"):
        noise = torch.randn(3, 1, 384, 384, generator=g)
        if kind == "grain":  # correlated as a demosaiced sensor's: blurred, rescaled to std 1
            noise = torch.nn.functional.conv2d(torch.nn.functional.pad(noise, (3, 3, 3, 3), mode="reflect"), kernel)
            noise = noise / noise.std()
        noisy = ((smooth * 0.8 + 0.1 + 10 / 255 * noise[:, 0]).clamp(0, 1) * 255).round().byte()  # (3, H, W)
        buf = io.BytesIO()
        Image.fromarray(noisy.permute(1, 2, 0).numpy()).save(buf, "JPEG", quality=90)
        photo = torch.from_numpy(np.asarray(Image.open(buf).convert("RGB")).copy()).permute(2, 0, 1)
        present = float((photo.double() - (smooth * 0.8 + 0.1).double() * 255).std())
        assert photo_sigma(photo) * 255 == pytest.approx(present, rel=0.15), kind
        if kind == "grain":  # the finest band alone, what was read before: a third of it
            assert float(estimate_sigma(photo[None].float() / 127.5 - 1)) * 255 < 0.5 * present

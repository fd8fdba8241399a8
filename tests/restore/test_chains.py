"""The chains (denoiser/restore/chains.py; one request and its plan are tests/restore/test_plan.py's): denoise, edit
and inpaint on the shipped synthetic-shapes model (the seed rule on a tiny random one); noise estimation on known noise."""

from __future__ import annotations

import pytest
import torch
from diffusers import DDPMScheduler
from PIL import Image

from denoiser.cli.main import main
from denoiser.data import make_synthetic
from denoiser.diffusion import Diffusion
from denoiser.folders.model_dir import WEIGHTS_DIR, load_model
from denoiser.restore.chains import denoise, edit, estimate_sigma, inpaint, psnr, restore, with_noise
from denoiser.sampling.guidance import Guidance
from denoiser.sampling.loop import make_sampler, sample

MODEL = WEIGHTS_DIR / "synthetic-shapes"


@pytest.fixture(scope="module")
def model():
    unet, sched = load_model(MODEL)
    return unet, sched, Diffusion(sched)


@pytest.fixture(scope="module")
def clean():
    return make_synthetic(8, 16, seed=12345).batch(torch.arange(8))[0]  # a seed the training set does not use


def _noisy(x: torch.Tensor, sigma: float, seed: int = 0) -> torch.Tensor:
    return x + 2 * sigma * torch.randn(x.shape, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("sigma", [0.05, 0.1, 0.2, 0.4])
def test_mmse_denoising_lowers_the_error(model, clean, sigma):
    unet, sched, diffusion = model
    noisy = _noisy(clean, sigma)
    target = clean / 2 + 0.5
    before = psnr((noisy / 2 + 0.5).clamp(0, 1), target).mean()
    after = psnr(denoise(unet, diffusion, noisy, sigma=sigma).images, target).mean()
    assert after > before + 5  # dB; measured +8 to +14 on this model
    sampled = psnr(denoise(unet, diffusion, noisy, sigma=sigma, method="sample", steps=10).images, target).mean()
    assert sampled > before


def test_sigma_maps_to_the_matching_noise_level(model):
    _, sched, diffusion = model
    a = torch.tensor(sched.alphas_cumprod, dtype=torch.float64)
    for sigma in (0.01, 0.1, 0.5):
        t = diffusion.sigma_to_timestep(sigma)
        assert ((1 - a[t]) / a[t]).sqrt() == pytest.approx(2 * sigma, rel=0.1)  # the nearest of T levels
    with pytest.raises(ValueError, match="sigma must be positive"):
        diffusion.sigma_to_timestep(0)


@pytest.mark.parametrize("sigma", [0.05, 0.1, 0.2])
def test_noise_estimate_within_20_percent(clean, sigma):
    est = estimate_sigma(_noisy(clean, sigma, seed=1))
    assert est.shape == (8,)
    assert float(est.mean()) == pytest.approx(sigma, rel=0.2)
    assert float(estimate_sigma(clean).max()) < 0.01  # clean flat shapes: ~no noise


def test_denoise_with_estimated_sigma(model, clean):
    unet, sched, diffusion = model
    noisy = _noisy(clean, 0.1)
    target = clean / 2 + 0.5
    auto = denoise(unet, diffusion, noisy).images
    assert psnr(auto, target).mean() > psnr((noisy / 2 + 0.5).clamp(0, 1), target).mean() + 5


def test_restore_says_which_sigma_its_denoise_removed(model, clean):
    """Issue 41 item 11: the σ a denoise estimated is reported (the app shows it), and denoising with it is the same as
    denoise() estimating it itself; a clean picture's is ~0, edit and inpaint report none."""
    unet, sched, diffusion = model
    picture = Image.fromarray(((clean[0] / 2 + 0.5) * 255).round().byte().permute(1, 2, 0).numpy())
    noisy = restore(unet, diffusion, picture, "denoise", add_noise=0.1, seed=2)
    assert noisy.sigma == pytest.approx(float(estimate_sigma(noisy.noisy).mean()))
    assert noisy.sigma == pytest.approx(0.1, rel=0.2)
    assert torch.equal(noisy.result.images, denoise(unet, diffusion, noisy.noisy).images)  # as if estimated inside
    assert restore(unet, diffusion, picture, "denoise").sigma < 0.01  # clean: nothing to remove
    assert restore(unet, diffusion, picture, "denoise", sigma=0.2).sigma == 0.2  # the σ given
    assert restore(unet, diffusion, picture, "edit", strength=0.1, steps=2).sigma is None


def test_edit_strength_zero_keeps_and_one_samples(model, clean):
    unet, sched, diffusion = model
    kept = edit(unet, diffusion, clean, strength=0.0).images
    assert torch.equal(kept, (clean / 2 + 0.5).clamp(0, 1))
    light = edit(unet, diffusion, clean, strength=0.2, steps=10).images
    full = edit(unet, diffusion, clean, strength=1.0, steps=10).images
    err_light, err_full = ((light - kept).abs().mean()), ((full - kept).abs().mean())
    assert err_light < err_full and err_full > 0.1  # strength 1 forgets the input
    # strength 1 is ancestral sampling from pure noise (DDPM on the same 10 timesteps)
    ref = sample(unet, make_sampler("ddpm", sched.config), 8, timesteps=list(range(999, -1, -100))[:10], seed=1)
    assert abs(float(full.std()) - float(ref.images.std())) < 0.1
    with pytest.raises(ValueError, match="strength must be in"):
        edit(unet, diffusion, clean, strength=1.5)


def test_edit_follows_the_seed_rule(model, clean):
    """Image k of an edited batch is the edit of that image alone with seed + k: the batch never changes it."""
    unet, _, diffusion = model
    batch = edit(unet, diffusion, clean[:3], strength=0.5, steps=4, seed=7).images
    for k in range(3):
        alone = edit(unet, diffusion, clean[k : k + 1], strength=0.5, steps=4, seed=7 + k).images
        torch.testing.assert_close(batch[k : k + 1], alone, rtol=0, atol=1e-5)
    assert not torch.allclose(batch[0], edit(unet, diffusion, clean[:1], strength=0.5, steps=4, seed=8).images[0])


def _restored(operation: str, unet, diffusion: Diffusion, images: torch.Tensor, seed: int, labels) -> torch.Tensor:
    """`operation` on a tiny random model, a few steps: inpaint and edit with guidance, denoise down the chain."""
    if operation == "inpaint":
        mask = torch.zeros(1, 1, 16, 16)  # (1, 1, H, W): the same hole in every image
        mask[..., 4:12, 4:12] = 1
        return inpaint(unet, diffusion, images, mask, steps=3, seed=seed, class_label=labels,
                       guidance=Guidance(scale=2.0)).images
    if operation == "edit":
        return edit(unet, diffusion, images, strength=0.6, steps=3, seed=seed, class_label=labels,
                    guidance=Guidance(scale=2.0)).images
    return denoise(unet, diffusion, images, sigma=0.2, method="sample", steps=3, seed=seed, class_label=labels).images


@pytest.mark.parametrize("operation", ["inpaint", "edit", "denoise"])
def test_restoring_a_batch_gives_the_single_runs_of_the_seed_rule(class_unet, operation):
    """Image k of a batch restored with seed s is that image restored alone with seed s + k: every noise (the start,
    DDPM's steps, an edit's q(x_t | x₀), inpainting's re-noised known pixels) comes from image k's own generator."""
    diffusion = Diffusion(DDPMScheduler())
    images = torch.rand(3, 3, 16, 16, generator=torch.Generator().manual_seed(0)) * 2 - 1  # (B, C, H, W) in [-1, 1]
    labels = [0, 2, 1]
    batch = _restored(operation, class_unet, diffusion, images, 7, labels)
    for k in range(3):
        alone = _restored(operation, class_unet, diffusion, images[k : k + 1], 7 + k, labels[k])
        # the same noise; only the UNet's batching differs (~1e-5 after the first step's 1/√ᾱ_T; other noise: ~1)
        torch.testing.assert_close(batch[k : k + 1], alone, rtol=0, atol=1e-4)
    other_seed = _restored(operation, class_unet, diffusion, images[:1], 8, labels[0])
    assert (batch[:1] - other_seed).abs().max() > 0.01


def test_added_noise_follows_the_seed_rule():
    images = torch.zeros(3, 3, 8, 8)
    batch = with_noise(images, 0.1, seed=4)
    for k in range(3):
        assert torch.equal(batch[k : k + 1], with_noise(images[k : k + 1], 0.1, seed=4 + k))
    assert float(batch.std()) == pytest.approx(0.2, rel=0.1)  # σ on the [0, 1] scale: 2σ in [-1, 1]


def test_inpainting_keeps_known_pixels_and_fills_the_hole(model, clean):
    unet, sched, diffusion = model
    mask = torch.zeros(1, 1, 16, 16)
    mask[..., 5:11, 5:11] = 1
    out = inpaint(unet, diffusion, clean, mask, steps=20).images
    target = (clean / 2 + 0.5).clamp(0, 1)
    torch.testing.assert_close(out * (1 - mask), target * (1 - mask), rtol=0, atol=1e-6)
    hole_err = ((out - target).abs() * mask).sum() / (mask.sum() * 3 * 8)
    noise_err = ((torch.rand_like(target) - target).abs() * mask).sum() / (mask.sum() * 3 * 8)
    assert hole_err < 0.75 * noise_err  # the fill continues the shapes: closer than random pixels
    tv = (out[..., 1:, :] - out[..., :-1, :]).abs()[..., 5:10, 5:11].mean()  # vertical steps inside the hole
    assert tv < 0.1  # smooth fill, not noise (random pixels: ~0.33)
    with pytest.raises(ValueError, match="mask must be"):
        inpaint(unet, diffusion, clean, torch.zeros(1, 1, 8, 8))


def test_an_empty_mask_passes_the_image_through(model):
    unet, sched, diffusion = model
    image, black = Image.new("RGB", (40, 40), (200, 40, 40)), Image.new("L", (40, 40), 0)
    kept = restore(unet, diffusion, image, "inpaint", mask=black, steps=3)
    torch.testing.assert_close(kept.result.images * 2 - 1, kept.clean, rtol=0, atol=1e-6)  # nothing regenerated


def test_cli_denoise_edit_inpaint(tmp_path, capsys):
    img = tmp_path / "in.png"
    Image.new("RGB", (40, 30), (200, 40, 40)).save(img)  # another size: resized and centre-cropped
    out = tmp_path / "out.png"
    args = ["denoise", "--model", str(MODEL), "--image", str(img), "--add-noise", "0.1", "--out", str(out)]
    assert main(args) == 0
    text = capsys.readouterr().out
    assert "40x30 at its own size, in tiles of 16x16" in text and "PSNR" in text  # denoise keeps the size (tests/restore/test_tiles.py)
    assert Image.open(out).size == (40, 30)
    mask = tmp_path / "mask.png"
    Image.new("L", (40, 30), 0).save(mask)
    assert main(["inpaint", "--model", str(MODEL), "--image", str(img), "--mask", str(mask), "--steps", "3",
                 "--out", str(tmp_path / "i.png")]) == 0
    assert main(["edit", "--model", str(MODEL), "--image", str(img), "--strength", "0.3", "--steps", "3",
                 "--out", str(tmp_path / "e.png")]) == 0
    capsys.readouterr()
    (tmp_path / "bad.png").write_text("not an image")
    assert main(["denoise", "--model", str(MODEL), "--image", str(tmp_path / "bad.png"), "--out", str(out)]) == 2
    assert "bad.png' is not an image denoiser can read: use a PNG, JPEG or WebP file" in capsys.readouterr().err
    small = Image.new("L", (8, 6), 0)
    small.paste(255, (6, 0, 8, 6))  # the right quarter, drawn on a copy of a fifth of the size
    small.save(tmp_path / "small-mask.png")
    assert main(["inpaint", "--model", str(MODEL), "--image", str(img), "--mask", str(tmp_path / "small-mask.png"),
                 "--steps", "3", "--out", str(out)]) == 0  # stretched onto the image (tests/test_image_io.py)

"""FID: statistics and the Fréchet distance against float64 references, Inception features, the CLI."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from diffusers import DDPMScheduler
from PIL import Image

from denoiser.cli.main import main
from denoiser.evaluate.fid import (
    InceptionFeatures,
    Statistics,
    frechet_distance,
    inception_path,
    reference_statistics,
)
from denoiser.model.unet import UNet
from denoiser.sampling.pipeline import save_pipeline
from tests.conftest import TINY


def _reference_fid(f1: torch.Tensor, f2: torch.Tensor) -> float:
    """Textbook FID in float64: numpy-style covariances, tr(sqrtm(Σ1 Σ2)) from the non-symmetric product's
    eigenvalues (a different route from the implementation's symmetric one)."""
    f1, f2 = f1.double(), f2.double()
    mu1, mu2 = f1.mean(0), f2.mean(0)
    s1, s2 = torch.cov(f1.T), torch.cov(f2.T)
    eig = torch.linalg.eigvals(s1 @ s2)
    return float((mu1 - mu2).square().sum() + s1.trace() + s2.trace() - 2 * eig.sqrt().real.sum())


def test_frechet_distance_matches_a_float64_reference():
    g = torch.Generator().manual_seed(0)
    f1 = torch.randn(200, 16, generator=g) @ torch.randn(16, 16, generator=g)
    f2 = torch.randn(150, 16, generator=g) @ torch.randn(16, 16, generator=g) + 0.5
    ours = frechet_distance(Statistics.of(f1), Statistics.of(f2))
    assert ours == pytest.approx(_reference_fid(f1, f2), rel=1e-9)
    assert ours > 1.0
    assert frechet_distance(Statistics.of(f1), Statistics.of(f1)) == pytest.approx(0.0, abs=1e-8)


def test_frechet_distance_closed_form_for_diagonal_covariances():
    # Two Gaussians with diagonal covariances a, b: FID = |μ1 - μ2|² + Σ (√a - √b)².
    a, b = torch.tensor([1.0, 4.0, 9.0]), torch.tensor([4.0, 1.0, 0.25])
    mu1, mu2 = torch.tensor([0.0, 1.0, 2.0]), torch.tensor([1.0, 1.0, 0.0])
    s1 = Statistics(mu1.double(), torch.diag(a).double(), 10)
    s2 = Statistics(mu2.double(), torch.diag(b).double(), 10)
    expected = float((mu1 - mu2).square().sum() + (a.sqrt() - b.sqrt()).square().sum())
    assert frechet_distance(s1, s2) == pytest.approx(expected, rel=1e-12)


def test_statistics_are_numpy_style_and_round_trip(tmp_path):
    f = torch.randn(50, 8, dtype=torch.float64)
    s = Statistics.of(f)
    torch.testing.assert_close(s.mu, torch.from_numpy(np.mean(f.numpy(), axis=0)))
    torch.testing.assert_close(s.sigma, torch.from_numpy(np.cov(f.numpy(), rowvar=False)))
    back = Statistics.load(s.save(tmp_path / "ref.safetensors", source="test"))
    assert back.num_images == 50
    torch.testing.assert_close(back.sigma, s.sigma.float().double())
    with pytest.raises(ValueError, match="at least 2"):
        Statistics.of(torch.randn(1, 8))
    with pytest.raises(ValueError, match="feature sizes"):
        frechet_distance(s, Statistics.of(torch.randn(5, 4)))


@pytest.fixture(scope="module")
def extractor():
    return InceptionFeatures(check_sha1=True)


def test_inception_features_equal_the_plain_torchscript_module(extractor):
    images = torch.randint(0, 256, (3, 3, 32, 32), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    feats = extractor(images)
    assert feats.shape == (3, 2048) and feats.dtype == torch.float64
    plain = torch.jit.load(str(inception_path())).eval()
    x = torch.nn.functional.interpolate(images.float(), size=(299, 299), mode="bilinear", align_corners=False) / 128 - 1
    with torch.inference_mode():
        ref = plain(x).double()
    torch.testing.assert_close(feats, ref, rtol=1e-4, atol=1e-4)  # frozen + channels-last: rounding only
    assert (feats >= 0).all() and feats.std() > 0.01  # pool features after ReLU, not a constant
    with pytest.raises(ValueError, match="uint8"):
        extractor(images.float())


def test_cli_fid_caches_the_reference_and_scores_samples(tiny_unet, tmp_path, capsys, caplog):
    model = save_pipeline(tiny_unet, DDPMScheduler(), tmp_path / "model")
    data = tmp_path / "data" / "only"
    data.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for i in range(6):
        Image.fromarray(rng.integers(0, 256, (16, 16, 3), dtype=np.uint8)).save(data / f"{i}.png")
    ref = tmp_path / "ref.safetensors"
    args = ["evaluate", "--model", str(model), "--fid", "--num-samples", "4", "--steps", "2", "--reference", str(ref)]
    assert main(args) == 2 and "--data FOLDER" in capsys.readouterr().err  # no statistics yet, no data
    assert main([*args, "--data", str(tmp_path / "data"), "--val-size", "4"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["num_samples"] == 4 and out["reference"]["num_images"] == 4 and out["fid"] > 0
    assert Statistics.load(ref).num_images == 4
    # the cached statistics are used (no --data), and a saved sample array scores like generated images
    np.save(tmp_path / "s.npy", rng.integers(0, 256, (4, 16, 16, 3), dtype=np.uint8))
    assert main([*args, "--samples", str(tmp_path / "s.npy")]) == 0
    again = json.loads(capsys.readouterr().out)
    assert again["num_samples"] == 4 and again["fid"] != out["fid"]
    assert reference_statistics(ref).num_images == 4
    # samples of another size than the reference's images still score, with a warning that names the gap
    assert out["reference"]["image_size"] == 16 and "resolution gap" not in caplog.text
    np.save(tmp_path / "small.npy", rng.integers(0, 256, (4, 8, 8, 3), dtype=np.uint8))
    assert main([*args, "--samples", str(tmp_path / "small.npy")]) == 0
    assert json.loads(capsys.readouterr().out)["reference"]["image_size"] == 16
    assert "of 16x16 images and these are 8x8" in caplog.text


def test_cli_fid_samples_with_pag_and_autoguidance(tmp_path, capsys):
    torch.manual_seed(0)
    unet = UNet(**TINY, num_class_embeds=3).eval()
    model = save_pipeline(unet, DDPMScheduler(), tmp_path / "model")
    guide = save_pipeline(UNet(**{**TINY, "base_channels": 8, "norm_num_groups": 4}, num_class_embeds=3).eval(),
                          DDPMScheduler(), tmp_path / "guide")
    rng = np.random.default_rng(0)
    data = tmp_path / "data" / "only"
    data.mkdir(parents=True)
    for i in range(6):
        Image.fromarray(rng.integers(0, 256, (16, 16, 3), dtype=np.uint8)).save(data / f"{i}.png")
    args = ["evaluate", "--model", str(model), "--fid", "--num-samples", "4", "--steps", "2",
            "--reference", str(tmp_path / "ref.safetensors"), "--data", str(tmp_path / "data"), "--val-size", "4"]
    assert main(args) == 0
    plain = json.loads(capsys.readouterr().out)
    assert main([*args, "--pag-scale", "2", "--guide-model", str(guide), "--guide-scale", "1.5"]) == 0
    guided = json.loads(capsys.readouterr().out)
    assert guided["samples"].startswith("ddim-2, PAG 2 on default + autoguidance 1.5") and guided["fid"] != plain["fid"]
    assert main([*args, "--guide-scale", "2"]) == 2
    assert "needs a guide model" in capsys.readouterr().err

"""Attention statistics: bounds, a brute-force reference with the full N×N matrix, the ablation column, the CLI."""

from __future__ import annotations

import csv
import math

import pytest
import torch
from diffusers import DDPMScheduler
from PIL import Image

from denoiser import UNet
from denoiser.cli.main import main
from denoiser.evaluate.attention_stats import attention_stats, head_statistics, stats_chart
from denoiser.model.attention_blocks import identity_attention
from denoiser.model.attention_capture import capture_attention
from denoiser.sampling.pipeline import save_pipeline
from tests.conftest import TINY


@pytest.fixture
def unet():
    torch.manual_seed(0)
    return UNet(**TINY, num_class_embeds=3).eval()


def test_head_statistics_match_the_full_matrix_and_blocks_do_not_matter(unet):
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad(), capture_attention(unet) as recs:
        unet(x, 500)
    rec = recs[0]  # down.1.attn.0: 8x8 tokens of a 16x16 image
    H, W = rec.size
    w = torch.softmax((rec.q.double() @ rec.k.double().transpose(-1, -2)) * rec.scale, dim=-1)  # (B, h, N, N)
    ys, xs = torch.meshgrid(torch.arange(H), torch.arange(W), indexing="ij")
    pos = torch.stack([ys.flatten(), xs.flatten()], -1).double() * (16 / H)
    dist = ((pos[:, None] - pos[None]) ** 2).sum(-1).sqrt()  # (N, N)
    want = {
        "mean_distance": (w * dist).sum(-1).mean((0, 2)),
        "entropy": -(w * w.log()).sum(-1).mean((0, 2)),
        "self_weight": w.diagonal(dim1=-2, dim2=-1).mean((0, 2)),
    }
    for block in (64, 7):  # one block, and blocks that do not divide N
        got = head_statistics(rec, 16, query_block=block)
        for key in want:
            torch.testing.assert_close(got[key].double(), want[key], rtol=1e-4, atol=1e-5)


def test_rows_lie_within_their_bounds_and_cover_every_layer_head_and_timestep(unet):
    images = torch.rand(3, 3, 16, 16) * 2 - 1
    rows = attention_stats(unet, DDPMScheduler(), images, torch.tensor([0, 1, 2]), timesteps=(900, 100))
    layers = ["down.1.attn.0", "mid_attn", "up.0.attn.0", "up.0.attn.1"]
    assert {(r.timestep, r.layer, r.head) for r in rows} == {(t, n, h) for t in (900, 100) for n in layers for h in (-1, 0, 1)}
    max_dist = math.hypot(16, 16)
    for r in rows:
        assert 0 < r.mean_distance < max_dist
        assert 0 <= r.entropy <= r.max_entropy + 1e-6 and r.max_entropy == pytest.approx(math.log(r.resolution**2))
        assert 0 < r.self_weight < 1 and r.output_change > 0
    chart = stats_chart(rows)  # one column of four charts and the legend: readable at a phone's width
    assert chart.size[0] == 480 and chart.size[1] > 4 * 250


def test_output_change_is_the_identity_switch_measured(unet):
    images = torch.rand(2, 3, 16, 16) * 2 - 1
    sched = DDPMScheduler()
    rows = attention_stats(unet, sched, images, None, timesteps=(300,), heads=False, seed=5)
    row = next(r for r in rows if r.layer == "mid_attn")
    # by hand: the same seeded noise, the plain and the switched prediction
    noise = torch.randn(images.shape, generator=torch.Generator().manual_seed(5))
    t = torch.full((2,), 300)
    x_t = sched.add_noise(images, noise, t)
    with torch.no_grad():
        base = unet(x_t, t).sample
        with identity_attention(unet, ["mid_attn"]):
            switched = unet(x_t, t).sample
    assert row.output_change == pytest.approx(float((switched - base).norm() / base.norm()), rel=1e-4)
    delta = float((switched - noise).pow(2).mean() - (base - noise).pow(2).mean())
    assert row.eps_mse_delta == pytest.approx(delta, rel=1e-3, abs=1e-7)


def test_bad_timesteps_and_images_are_refused(unet):
    with pytest.raises(ValueError, match="timesteps must lie in 0..999"):
        attention_stats(unet, DDPMScheduler(), torch.zeros(1, 3, 16, 16), timesteps=(1000,))
    with pytest.raises(ValueError, match=r"images must be \(B, 3, 16, 16\)"):
        attention_stats(unet, DDPMScheduler(), torch.zeros(1, 3, 8, 8))


def test_cli_writes_csv_and_chart_for_generated_and_user_images(unet, tmp_path, capsys):
    model = save_pipeline(unet, DDPMScheduler(), tmp_path / "m")
    out = tmp_path / "stats"
    assert main(["attention-stats", "--model", str(model), "--out-dir", str(out), "--num-images", "2",
                 "--timesteps", "500,50"]) == 0
    with (out / "attention_stats.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 2 * 4 * 3 and {r["timestep"] for r in rows} == {"500", "50"}
    assert Image.open(out / "attention_stats.png").width == 480  # one column: readable at a phone's width
    assert "largest effects" in capsys.readouterr().out
    pics = tmp_path / "pics"
    pics.mkdir()
    Image.new("RGB", (40, 30), (200, 20, 20)).save(pics / "a.png")
    assert main(["attention-stats", "--model", str(model), "--out-dir", str(out), "--images", str(pics),
                 "--timesteps", "100", "--no-heads"]) == 0
    assert "1 images from" in capsys.readouterr().out
    assert main(["attention-stats", "--model", str(model), "--out-dir", str(out), "--timesteps", "a,b"]) == 2
    assert "comma-separated integers" in capsys.readouterr().err

"""denoiser.app.photo_time: the measured tile rate is a photo's steady rate, and the wait said before Run."""

from __future__ import annotations

import torch
from diffusers import DDPMScheduler

from denoiser import UNet
from denoiser.app import photo_time
from denoiser.app.photo_time import PhotoTime, measure_tile_rate
from denoiser.restore.tiles import TileOptions
from tests.conftest import TINY

PER_TILE = 0.01  # fake seconds a tile costs in a full batch
NEW_SHAPE = 2.0  # fake seconds the first UNet call of a batch size costs (oneDNN prepares its kernels for the shape)


class FakeClock:
    """time.perf_counter for measure_tile_rate, advanced by the UNet's calls: a tile costs PER_TILE, and the first
    call of each batch size NEW_SHAPE more, as a CPU's first call of a new shape does (no sleeping, exact numbers)."""

    def __init__(self) -> None:
        self.now, self.seen = 0.0, set()

    def __call__(self) -> float:
        return self.now

    def hook(self, module, args, kwargs) -> None:
        sample = args[0] if args else kwargs["sample"]
        batch = sample.shape[0]  # (B, C, H, W)
        self.now += batch * PER_TILE + (NEW_SHAPE if batch not in self.seen else 0.0)
        self.seen.add(batch)


def test_the_tile_rate_is_a_photos_steady_rate_not_its_warm_up(monkeypatch):
    """Issue 72 finding 4: the rate was timed on 36 tiles after a one-tile warm-up, so the timed run paid for the
    first call of a full batch (and of a 4-tile remainder): 17 tiles a second where a photo's run does ~33, capping
    the photo budget at 7.8 MP and shrinking photos for nothing. Timed on full batches after a full-batch warm-up,
    the rate is the steady one a photo's thousands of tiles run at."""
    torch.manual_seed(0)
    unet = UNet(**TINY).eval()
    clock = FakeClock()
    unet.register_forward_pre_hook(clock.hook, with_kwargs=True)
    monkeypatch.setattr(photo_time.time, "perf_counter", clock)
    rate = measure_tile_rate(unet, DDPMScheduler())
    assert abs(rate - 1 / PER_TILE) < 1e-6 * (1 / PER_TILE), rate  # 100 tiles a second, as every full batch runs
    assert TileOptions().batch_size in clock.seen


def test_the_wait_is_said_as_minutes_and_tiles():
    wait = PhotoTime(tiles=15_552, rate=55.5, budget=600.0)
    assert wait.describe() == "about 4 min 40 s (15,552 tiles at 56 a second)" and not wait.over
    assert PhotoTime(tiles=15_552, rate=20.0, budget=600.0).over


def test_the_scope_says_the_copy_it_denoises_without_contradicting_itself(tmp_path, monkeypatch):
    """Issue 72 finding 4: a photo over the budget read "denoise your whole photo at its own size … on a copy scaled
    down to 2418x3224". Over the budget the line names the copy; within it, the whole photo at its own size."""
    from PIL import Image

    from denoiser.app.engine import Engine
    from denoiser.app.photo import keep_upload
    from denoiser.app.photo_tab import PhotoTab
    from denoiser.sampling.pipeline import save_pipeline
    from tests.conftest import app_page

    monkeypatch.setenv("GRADIO_TEMP_DIR", str(tmp_path))
    torch.manual_seed(0)
    save_pipeline(UNet(**TINY, num_class_embeds=3).eval(), DDPMScheduler(), tmp_path / "weights" / "tiny")
    monkeypatch.setattr(Engine, "tile_rate", lambda self, model: 1000.0)  # exact sizes: no measurement
    photo = tmp_path / "photo.png"
    Image.new("RGB", (700, 500), (90, 120, 200)).save(photo)
    tab = app_page(tmp_path / "weights").tab(PhotoTab)
    upload = keep_upload(str(photo))
    fits = tab.scope("tiny", "denoise", 0, upload)
    assert fits.startswith("Run: **denoise your whole photo at its own size**") and "scaled" not in fits, fits
    monkeypatch.setenv("DENOISER_PHOTO_SECONDS", str(0.5 * tab.engine.photo_time("tiny", 700, 500).seconds))
    for noise, said in ((0, "Run: **denoise a copy of your photo scaled down to "),
                        (0.1, "Run: **noise σ 0.1 is added to a copy of your photo scaled down to ")):
        over = tab.scope("tiny", "denoise", noise, upload)
        assert over.startswith(said) and "whole photo" not in over and "own size" not in over, over
        w, h = (int(v) for v in over[len(said):].split("**")[0].split(",")[0].split("x"))
        assert w * h < 700 * 500 / 1.8 and f"{w}x{h}" in over and "on this server" in over, over

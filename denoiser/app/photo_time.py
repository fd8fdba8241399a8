"""How long a photo's tiled denoise will take on this server, and how long it may: the Photo tab's photo budget.

A photo is denoised at its own size in tiles of the model's size (denoiser.restore.tiles), so its cost is its tile count. How
fast tiles go depends on the CPU and on the path that runs there (float32 or bf16, denoiser.fast.precision), so the
rate is measured, once per model, by timing that very path (`denoise_photo`) on a synthetic photo's full batches of
tiles after a warm-up batch, the steady rate a photo's thousands of tiles run at. A photo
whose estimate is over `photo_seconds()` (DENOISER_PHOTO_SECONDS, default 10 minutes) is denoised as a copy scaled down
to fit; the page says the estimate before Run (`PhotoTime.describe`).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

import torch

from denoiser.restore.tiles import TileOptions, denoise_photo

__all__ = ["PHOTO_SECONDS", "PhotoTime", "photo_seconds", "measure_tile_rate"]

PHOTO_SECONDS = 600.0  # a phone's 12 MP photo at its own size with cifar10 on 2 cores (about 5 min in float32)
# full batches of tiles timed to measure the rate, after one batch of warm-up: 64 tiles, about 2 s on 2 cores (36 tiles
# after a one-tile warm-up said 17 tiles a second where a photo ran 33: issue 72 finding 4)
RATE_BATCHES = 2


def photo_seconds() -> float:
    """The seconds a photo's denoise may take on this server: DENOISER_PHOTO_SECONDS, else PHOTO_SECONDS."""
    value = os.environ.get("DENOISER_PHOTO_SECONDS", "")
    try:
        seconds = float(value) if value.strip() else PHOTO_SECONDS
    except ValueError:
        raise ValueError(f"DENOISER_PHOTO_SECONDS must be a number of seconds, got {value!r}") from None
    if not seconds > 0:
        raise ValueError(f"DENOISER_PHOTO_SECONDS must be above 0, got {value!r}")
    return seconds


@dataclass(frozen=True)
class PhotoTime:
    """A photo's tiled denoise against the budget: its tiles, the measured rate and the seconds it may take."""

    tiles: int  # UNet images the denoise runs (count_tiles)
    rate: float  # UNet images (tiles) a second on this server's path, measured (measure_tile_rate)
    budget: float  # photo_seconds() when counted
    passes: float = 1.0  # UNet passes a tile takes (two with classifier-free guidance)

    @property
    def seconds(self) -> float:
        return self.tiles * self.passes / self.rate

    @property
    def over(self) -> bool:
        return self.seconds > self.budget

    def describe(self) -> str:
        """"about 4 min 40 s (15,552 tiles at 55 a second)"."""
        return f"about {_duration(self.seconds)} ({self.tiles:,} tiles at {self.rate / self.passes:,.0f} a second)"


def _duration(seconds: float) -> str:
    if seconds < 60:
        return f"{max(1, round(seconds))} s"
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes} min {rest} s" if rest else f"{minutes} min"


@torch.inference_mode()
def measure_tile_rate(unet, scheduler, options: TileOptions | None = None) -> float:
    """Tiles a second of `denoise_photo` with `unet` here (its precision and kernels as every photo gets them), at the
    steady rate of a photo's full batches: a photo one tile tall and 1 + RATE_BATCHES batches wide, its first batch
    the warm-up (a CPU's first call of a batch's shape prepares its kernels: timed, it made the rate half a photo's),
    the rest timed from the end of the first to the end of the last."""
    opts = options or TileOptions()
    side = unet.config.sample_size
    stride = side - opts.overlap
    tiles = opts.batch_size * (1 + RATE_BATCHES)
    length = side + (tiles - 1) * stride  # a row of `tiles` tiles
    photo = torch.randint(0, 256, (3, side, length), generator=torch.Generator().manual_seed(0), dtype=torch.uint8)
    ends: list[tuple[int, float]] = []  # (tiles done, when) after each batch
    denoise_photo(unet, scheduler, photo, sigma=0.05, options=opts,
                  progress=lambda done, total: ends.append((done, time.perf_counter())))
    (first_done, first_end), (last_done, last_end) = ends[0], ends[-1]
    return (last_done - first_done) / (last_end - first_end)

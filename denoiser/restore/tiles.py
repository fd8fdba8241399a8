"""A photo of any size denoised by a model of small squares: overlapping tiles at the model's size, blended.

Denoising is local: the noise in one pixel says nothing of pixels far away, so the model's one-step MMSE
estimate (`denoiser.restore.chains.denoise`, method "mmse": x₀ predicted from √ᾱ_t·y at the timestep whose noise
matches σ) on tiles of its own size, cut with overlap and blended with a window that fades each tile out
towards its edges (where a convolution sees the tile's padding instead of the photo), is the photo's
estimate without seams. Tiles go through the UNet in batches, inside `sampling_context` (the sampling
loop's prepared weights).

Memory stays bounded whatever the photo's size: the photo and the result are uint8 (3 bytes a pixel each;
150 MB apiece at 50 megapixels) and the float buffers hold one band of tile rows, not the photo.
Tile size, overlap and window were chosen by measurement: bench/denoise_tiles.md.

`denoise_photo` is the one entry point from a photo, reached from every front door through `denoiser.restore.plan`
(a one-step denoise keeps the photo's size, whatever it is), each with its own progress display.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from denoiser.diffusion import Diffusion
from denoiser.pixels import to_model_range, to_uint8, to_unit, uint8_to_unit
from denoiser.restore.chains import estimate_sigma, psnr, with_noise
from denoiser.sampling.guidance import Guidance
from denoiser.sampling.loop import sampling_context

__all__ = ["TileOptions", "WINDOWS", "StopTiling", "DenoisedPhoto", "denoise_photo", "count_tiles", "tile_starts",
           "blend_window", "denoise_tiles"]

WINDOWS = ("cosine", "linear", "flat")
SIGMA_CROP = 1024  # sigma is estimated on the centre crop of at most this many pixels a side
GRAIN_SIDE = 256  # a photo at least this many pixels a side has its grain measured on the 2x2 means too (photo_sigma)


@dataclass
class TileOptions:
    """How a photo is cut into tiles and put back together (defaults: bench/denoise_tiles.md)."""

    tile: int = 0  # tile side in pixels; 0: the model's sample_size
    overlap: int = 4  # pixels two neighbouring tiles share; 0: side by side
    window: str = "cosine"  # blending: "cosine" or "linear" ramps over the overlap, "flat" (plain mean)
    # tiles per UNet call: 32 ran a photo 1.21-1.24x faster than 128 (whose feature maps, 33 MB each, leave the
    # caches) and as fast as 16-48 (bench/photo_denoise_time.md)
    batch_size: int = 32


class StopTiling(Exception):
    """Raised when `should_stop()` says so: the tiles done so far are dropped."""


@dataclass
class DenoisedPhoto:
    """What `denoise_photo` did; each a (3, H, W) uint8 image at the photo's own size."""

    photo: torch.Tensor  # the photo as given
    noisy: torch.Tensor | None  # the photo with the added noise (the round trip), or None
    result: torch.Tensor  # the denoised photo
    sigma: float = 0.0  # the noise σ removed ([0, 1] pixel scale: the one given, or estimated on the noisy photo)

    def psnr(self) -> tuple[float, float] | None:
        """(noisy, result) PSNR in dB against the photo when noise was added, else None."""
        if self.noisy is None:
            return None
        target = uint8_to_unit(self.photo[None])
        noisy, result = (float(psnr(uint8_to_unit(x[None]), target)) for x in (self.noisy, self.result))
        return noisy, result


def denoise_photo(
    unet, scheduler, photo: torch.Tensor, sigma: float | None = None, *, add_noise: float | None = None, seed: int = 0,
    class_label: int | None = None, guidance: Guidance | None = None, options: TileOptions | None = None,
    progress: Callable[[int, int], None] | None = None, should_stop: Callable[[], bool] | None = None,
    out: torch.Tensor | None = None,
) -> DenoisedPhoto:
    """A (3, H, W) uint8 photo denoised at its own size (`denoise_tiles`), on the noise schedule of `scheduler`
    (the model's training scheduler).

    add_noise: add Gaussian noise of this σ ([0, 1] pixel scale) first, seeded by `seed` as every restore's added
    noise is (`denoiser.restore.chains.with_noise`), and quantised to uint8 as a camera writes it (the round trip, scored by `DenoisedPhoto.psnr`); sigma is then still the σ to
    remove (None: estimated, `photo_sigma`, and returned in `DenoisedPhoto.sigma`). The other arguments as for
    `denoise_tiles`.
    """
    noisy = None
    if add_noise is not None:
        noisy = to_uint8(to_unit(with_noise(to_model_range(photo[None]), add_noise, seed))[0])  # (3, H, W) uint8
    given = photo if noisy is None else noisy
    sigma = photo_sigma(given) if sigma is None else float(sigma)  # what denoise_tiles would estimate
    result = denoise_tiles(unet, Diffusion(scheduler), given, sigma, options, progress, should_stop, class_label,
                           guidance, out)
    return DenoisedPhoto(photo, noisy, result, sigma)


def count_tiles(unet, height: int, width: int, options: TileOptions | None = None) -> int:
    """UNet images (tiles) `denoise_tiles` runs for a photo of this size (a smaller photo is padded to one tile)."""
    opts = options or TileOptions()
    tile = opts.tile or unet.config.sample_size
    return len(tile_starts(height, tile, tile - opts.overlap)) * len(tile_starts(width, tile, tile - opts.overlap))


def tile_starts(length: int, tile: int, stride: int) -> list[int]:
    """Start offsets of tiles of side `tile`, `stride` apart, covering 0..length; the last one ends at length."""
    if length <= tile:
        return [0]
    starts = list(range(0, length - tile, stride))
    return starts + [length - tile]


def blend_window(tile: int, overlap: int, kind: str = "cosine") -> torch.Tensor:
    """(tile, tile) blending weights: 1 inside, falling towards each edge over `overlap` pixels (never to 0,
    so a photo's border, where no neighbour overlaps, keeps its own tile)."""
    if kind not in WINDOWS:
        raise ValueError(f"window must be one of {', '.join(WINDOWS)}, got {kind!r}")
    d = torch.arange(tile, dtype=torch.float64)
    edge = torch.minimum(d, tile - 1 - d) + 0.5  # distance to the nearest edge, in pixels
    ramp = (edge / overlap).clamp(max=1.0) if overlap > 0 and kind != "flat" else torch.ones(tile, dtype=torch.float64)
    if kind == "cosine":
        ramp = torch.sin(ramp * math.pi / 2) ** 2
    return torch.outer(ramp, ramp).float()  # (tile, tile)


def _check(unet, image: torch.Tensor, opts: TileOptions, class_label: int | None = None) -> int:
    """The tile side, once everything is checked (before any work)."""
    config = unet.config
    classes = config.num_class_embeds or 0
    if class_label is not None and not 0 <= int(class_label) < classes:
        raise ValueError(f"class {class_label} is out of range: this model has {classes or 'no'} classes"
                         + (f" (0..{classes - 1})" if classes else "; leave the class out"))
    if image.ndim != 3 or image.shape[0] != config.in_channels or image.dtype != torch.uint8:
        raise ValueError(f"image must be a ({config.in_channels}, H, W) uint8 tensor, got {tuple(image.shape)} {image.dtype}")
    tile = opts.tile or config.sample_size
    factor = 2 ** (len(config.channel_mult) - 1)
    if tile < factor or tile % factor:
        raise ValueError(f"tile must be a positive multiple of {factor} (the UNet halves it {factor.bit_length() - 1} times), got {tile}")
    if not 0 <= opts.overlap <= tile // 2:
        raise ValueError(f"overlap must be in 0..{tile // 2} (half the tile), got {opts.overlap}")
    if opts.window not in WINDOWS:
        raise ValueError(f"window must be one of {', '.join(WINDOWS)}, got {opts.window!r}")
    if opts.batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {opts.batch_size}")
    return tile


def photo_sigma(image: torch.Tensor) -> float:
    """The noise σ ([0, 1] pixel scale) of a (3, H, W) uint8 photo, estimated on its centre crop (`estimate_sigma`).

    A camera's grain is not white: demosaicing and JPEG leave little of it in the finest wavelet band that
    `estimate_sigma` reads (10/255 of grain read as 3/255, and the denoise then left it), so on a photo of at least
    GRAIN_SIDE pixels a side the same is measured once more on its 2x2 means, where white noise keeps half its std (x2
    restores it) and grain most of its own; the larger of the two is the estimate (bench/noise_estimate.md: within
    about 10 % of the noise the photo holds, white or grain, JPEG or not). On smaller pictures the coarser band holds
    too much of the picture itself, and the finest band alone is read."""
    H, W = image.shape[-2:]
    top, left = max(0, (H - SIGMA_CROP) // 2), max(0, (W - SIGMA_CROP) // 2)
    crop = to_model_range(image[:, top : top + SIGMA_CROP, left : left + SIGMA_CROP][None])  # (1, 3, h, w)
    finest = float(estimate_sigma(crop))
    if min(crop.shape[-2:]) < GRAIN_SIDE:
        return finest
    return max(finest, 2 * float(estimate_sigma(F.avg_pool2d(crop, 2))))  # the 2x2 means: half a white noise's std


class _Bands:
    """Blended tiles of a band of rows at a time: weighted sums and weights of rows top..top+len, written to
    `out` (uint8) once no later tile reaches them."""

    def __init__(self, out: torch.Tensor) -> None:
        self.out, self.top = out, 0
        self.acc = torch.zeros((4, 0, out.shape[-1]))  # (3 colours + weight, rows, W)

    def move_to(self, y: int, bottom: int) -> None:
        """Rows above y are final (tiles come in row order): write them; then cover rows up to `bottom`."""
        if y > self.top:
            self._write(y - self.top)
        missing = bottom - self.top - self.acc.shape[1]
        if missing > 0:
            self.acc = torch.cat([self.acc, torch.zeros((4, missing, self.acc.shape[2]))], dim=1)

    def add(self, y: int, x: int, tile: torch.Tensor, window: torch.Tensor) -> None:
        """tile (3, T, T) in [0, 1] at row y, column x of the photo."""
        T, y = tile.shape[-1], y - self.top
        self.acc[:3, y : y + T, x : x + T] += tile * window
        self.acc[3, y : y + T, x : x + T] += window

    def finish(self) -> None:
        self._write(self.acc.shape[1])

    def _write(self, rows: int) -> None:
        band = self.acc[:, :rows]
        self.out[:, self.top : self.top + rows] = to_uint8(band[:3] / band[3:])
        self.acc, self.top = self.acc[:, rows:], self.top + rows


def denoise_tiles(
    unet, diffusion: Diffusion, image: torch.Tensor, sigma: float | None = None, options: TileOptions | None = None,
    progress: Callable[[int, int], None] | None = None, should_stop: Callable[[], bool] | None = None,
    class_label: int | None = None, guidance: Guidance | None = None, out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Remove Gaussian noise of std `sigma` ([0, 1] pixel scale; None: estimated) from a photo of any size.

    class_label, guidance: as for sampling (denoiser.sampling.guidance), applied to each tile's one x₀ prediction.

    image: (3, H, W) uint8. Returns the denoised (3, H, W) uint8. progress(done, total) after each batch of
    tiles; should_stop() before each: True raises StopTiling. A photo smaller than a tile is padded
    (replicated edges) and cropped back.

    out: the (3, H, W) uint8 tensor to write the result into (returned), e.g. a copy of the photo: a progress
    callback then sees the rows finished so far over the photo's others (the app's live preview); None: a new one.
    """
    opts = options or TileOptions()
    tile = _check(unet, image, opts, class_label)
    guidance = guidance or Guidance()
    guidance.check(unet, class_label is not None)
    H, W = image.shape[-2:]
    if H < tile or W < tile:  # pad up to one tile (replicated edges), denoise, crop back
        sigma = photo_sigma(image) if sigma is None else sigma
        padded = F.pad(image[None].float(), (0, max(0, tile - W), 0, max(0, tile - H)), mode="replicate")[0].to(torch.uint8)
        result = denoise_tiles(unet, diffusion, padded, sigma, opts, progress, should_stop, class_label, guidance)[:, :H, :W]
        if out is None:
            return result
        out.copy_(result)
        return out
    sigma = photo_sigma(image) if sigma is None else float(sigma)
    t = diffusion.sigma_to_timestep(max(sigma, 1e-4))
    ys, xs = tile_starts(H, tile, tile - opts.overlap), tile_starts(W, tile, tile - opts.overlap)
    window = blend_window(tile, opts.overlap, opts.window)
    if out is None:
        out = torch.empty_like(image)
    elif out.shape != image.shape or out.dtype != torch.uint8:
        raise ValueError(f"out must be a {tuple(image.shape)} uint8 tensor like the image, got {tuple(out.shape)} {out.dtype}")
    bands, places = _Bands(out), [(y, x) for y in ys for x in xs]  # row order: finished rows are written early
    with torch.inference_mode(), sampling_context(unet):
        for first in range(0, len(places), opts.batch_size):
            if should_stop is not None and should_stop():
                raise StopTiling(f"stopped after {first} of {len(places)} tiles")
            batch = places[first : first + opts.batch_size]
            bands.move_to(batch[0][0], batch[-1][0] + tile)
            crops = torch.stack([image[:, y : y + tile, x : x + tile] for y, x in batch])  # (B, 3, T, T) uint8
            for (y, x), denoised in zip(batch, _x0(unet, diffusion, crops, t, class_label, guidance)):
                bands.add(y, x, denoised, window)
            if progress is not None:
                progress(first + len(batch), len(places))
        bands.finish()
    return out


def _x0(unet, diffusion: Diffusion, crops: torch.Tensor, t: int, class_label: int | None, guidance: Guidance) -> torch.Tensor:
    """(B, 3, T, T) uint8 noisy tiles -> the model's x₀ estimates (B, 3, T, T) in [0, 1], on the CPU: the tiles
    scaled by √ᾱ_t are x_t (denoiser.restore.chains's module docstring)."""
    device, dtype, B = unet.device, unet.dtype, crops.shape[0]
    abar = float(diffusion.alphas_cumprod[t])
    x_t = abar**0.5 * to_model_range(crops)
    timestep = torch.full((B,), t, dtype=torch.long)
    labels = None if class_label is None else torch.full((B,), int(class_label), dtype=torch.long, device=device)
    model_in = x_t.to(device=device, dtype=dtype).contiguous(memory_format=torch.channels_last)
    # one timestep for the batch (0-d): guidance stacks the tiles' rows for its terms and the UNet broadcasts it
    out = guidance.predictor(unet, labels)(model_in, torch.tensor(t, device=device)).float().cpu()
    return to_unit(diffusion.predict_x0(x_t, out, timestep))

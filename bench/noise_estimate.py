"""How far to trust the photo denoise's noise estimate (denoiser.restore.tiles.photo_sigma): known noise against the estimate.

    .venv/bin/python -m bench.noise_estimate [--images 16] [--out bench/noise_estimate.md]

Pictures: CIFAR-10 training images (../shared/data/cifar10-jpeg/train, every 997th) enlarged to 512x512 (bicubic: smooth,
as a photo's content is at its own scale), given noise of a known σ (in /255), then saved as a JPEG (quality 90, Pillow's
4:2:0 chroma) or kept as they are. Two kinds of noise: white (independent per pixel and channel) and grain (white noise
blurred by a Gaussian of 0.8 px and rescaled to the same std: a camera's demosaiced, processed sensor noise). "present"
is the std of the decoded picture minus the clean one: what the JPEG left of the noise (its chroma subsampling and
quantisation remove some), the σ a denoise should remove. Columns: the finest band alone (`estimate_sigma`, what the
photo denoise read before) and `photo_sigma` (the larger of that and the 2x2 means' band x2). Median over the images.
"""

from __future__ import annotations

import argparse
import io
import statistics
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

from denoiser.pixels import to_model_range
from denoiser.restore.chains import estimate_sigma
from denoiser.restore.tiles import photo_sigma

DATA = Path(__file__).resolve().parent.parent.parent / "shared" / "data" / "cifar10-jpeg" / "train"


def grain(shape: tuple[int, ...], rng: np.random.Generator, blur: float) -> np.ndarray:
    """(H, W, 3) unit-std noise; blur > 0: each channel blurred by a Gaussian of that std (px), rescaled to std 1."""
    n = rng.normal(0, 1, shape)
    if blur == 0:
        return n
    g = torch.exp(-torch.arange(-3, 4, dtype=torch.float64) ** 2 / (2 * blur**2))
    g = g / g.sum()
    t = torch.from_numpy(n).permute(2, 0, 1)[:, None]  # (3, 1, H, W)
    t = F.conv2d(F.pad(t, (3, 3, 3, 3), mode="reflect"), (g[:, None] * g[None, :])[None, None])
    n = t[:, 0].permute(1, 2, 0).numpy()  # (H, W, 3)
    return n / n.std()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--images", type=int, default=16)
    p.add_argument("--out", default=None)
    args = p.parse_args()
    files = sorted(DATA.glob("*/*.jpg"))[::997][: args.images]
    clean = [np.asarray(Image.open(f).convert("RGB").resize((512, 512), Image.Resampling.BICUBIC)).astype(np.float64)
             for f in files]
    lines = ["| noise | file | σ added | σ present | finest band (before) | photo_sigma (now) |", "|---|---|---|---|---|---|"]
    for kind, blur in (("white", 0.0), ("grain", 0.8)):
        for quality in (90, None):
            for sigma in (0, 5, 10, 15, 25):
                present, before, now = [], [], []
                for k, picture in enumerate(clean):
                    noisy = np.clip(picture + sigma * grain(picture.shape, np.random.default_rng(k), blur), 0, 255)
                    img = Image.fromarray(noisy.round().astype(np.uint8))
                    if quality:
                        buf = io.BytesIO()
                        img.save(buf, "JPEG", quality=quality)
                        img = Image.open(buf).convert("RGB")
                    arr = np.asarray(img)
                    present.append(float((arr.astype(np.float64) - picture).std()))
                    photo = torch.from_numpy(arr.copy()).permute(2, 0, 1)  # (3, H, W) uint8
                    before.append(float(estimate_sigma(to_model_range(photo[None]))) * 255)
                    now.append(photo_sigma(photo) * 255)
                m = statistics.median
                lines.append(f"| {kind} | {'JPEG q' + str(quality) if quality else 'PNG'} | {sigma} | {m(present):.1f} | "
                             f"{m(before):.1f} | {m(now):.1f} |")
                print(lines[-1], flush=True)
    if args.out:
        Path(args.out).write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()

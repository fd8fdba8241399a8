"""Images per UNet batch on the CPU: a run of many images (`denoiser sample --num-images 64`, FID's samples) at each
batch size, through `denoiser.sampling.plan.resolve`/`run` as the CLI runs it.

    .venv/bin/python bench/sample_batch.py --model cifar10 --batches 16,32,64 [--images 64] [--steps 10] [--rounds 3]

The model's own sampler and guidance (classes spread, or the prompt "red apple"); `--steps` steps. Sides alternate
round by round after a warm-up round; prints each batch's median and fastest seconds, and the largest pixel difference
of its images from the first batch's (0..255: the batch size must never change the images).
"""

from __future__ import annotations

import argparse
import sys
from functools import partial
from pathlib import Path

import numpy as np
import torch
from profiling import cpu_name, interleaved, spread

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from denoiser.folders.model_dir import load  # noqa: E402
from denoiser.request import SampleRequest  # noqa: E402
from denoiser.sampling.plan import resolve, run  # noqa: E402

WEIGHTS = Path(__file__).resolve().parent.parent / "weights"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="cifar10")
    p.add_argument("--batches", default="16,32,64")
    p.add_argument("--images", type=int, default=64)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    model = load(WEIGHTS / args.model)
    batches = [int(b) for b in args.batches.split(",")]
    text = bool(model.unet.config.cross_attention_dim)

    pixels: dict[int, np.ndarray] = {}  # each batch's latest images, (N, H, W, 3) uint8

    def images(batch: int) -> None:
        condition = dict(prompts="red apple") if text else dict(classes="spread")
        request = SampleRequest(num_images=args.images, seed=0, batch_size=batch, steps=args.steps, **condition)
        pixels[batch] = np.stack([np.asarray(image) for image in run(resolve(request, model)).images])

    seconds = interleaved({b: partial(images, b) for b in batches}, args.rounds)
    print(f"CPU: {cpu_name()}, {torch.get_num_threads()} threads, torch {torch.__version__}")
    first = pixels[batches[0]].astype(int)
    for b, ts in seconds.items():
        diff = int(np.abs(pixels[b].astype(int) - first).max())
        print(f"{args.model}, {args.images} images, {args.steps} steps, batch {b}: {spread(ts)}; max pixel difference {diff}")


if __name__ == "__main__":
    main()

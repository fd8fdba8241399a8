"""Images per UNet batch on the CPU: a run of many images (`denoiser sample --num-images 64`, FID's samples) at each
batch size, through `denoiser.sampling.plan.resolve`/`run` as the CLI runs it.

    .venv/bin/python -m bench.sample_batch --model cifar10 --batches 16,32,64 [--images 64] [--steps 10] [--rounds 3]
    .venv/bin/python -m bench.sample_batch --batches 64 --rows-per-call 32,1000   # the app's one batch, split or not

The model's own sampler and guidance (classes spread, or the prompt "red apple"); `--steps` steps. Sides alternate
round by round after a warm-up round; prints each batch's median and fastest seconds, and the largest pixel difference
of its images from the first batch's (0..255: the batch size must never change the images). `--rows-per-call`: the
most rows a UNet call takes (denoiser.sampling.guidance.ROWS_PER_CALL; a batch with more runs as several calls),
each value a side of its own for every batch.
"""

from __future__ import annotations

import argparse
from functools import partial
from pathlib import Path

import numpy as np
import torch

from bench.common import cpu_name, interleaved, spread
from denoiser.folders.model_dir import load
from denoiser.request import SampleRequest
from denoiser.sampling import guidance
from denoiser.sampling.plan import resolve, run

WEIGHTS = Path(__file__).resolve().parent.parent / "weights"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="cifar10")
    p.add_argument("--batches", default="16,32,64")
    p.add_argument("--images", type=int, default=64)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--rows-per-call", default=str(guidance.ROWS_PER_CALL))
    args = p.parse_args()
    model = load(WEIGHTS / args.model)
    sides = [(int(b), int(r)) for b in args.batches.split(",") for r in args.rows_per_call.split(",")]
    text = bool(model.unet.config.cross_attention_dim)

    pixels: dict[tuple[int, int], np.ndarray] = {}  # each side's latest images, (N, H, W, 3) uint8

    def images(batch: int, rows: int) -> None:
        condition = dict(prompts="red apple") if text else dict(classes="spread")
        request = SampleRequest(num_images=args.images, seed=0, batch_size=batch, steps=args.steps, **condition)
        guidance.ROWS_PER_CALL = rows
        pixels[batch, rows] = np.stack([np.asarray(image) for image in run(resolve(request, model)).images])

    seconds = interleaved({side: partial(images, *side) for side in sides}, args.rounds)
    print(f"CPU: {cpu_name()}, {torch.get_num_threads()} threads, torch {torch.__version__}")
    first = pixels[sides[0]].astype(int)
    for (b, r), ts in seconds.items():
        diff = int(np.abs(pixels[b, r].astype(int) - first).max())
        print(f"{args.model}, {args.images} images, {args.steps} steps, batch {b}, at most {r} rows a call: {spread(ts)}; "
              f"max pixel difference {diff}")


if __name__ == "__main__":
    main()

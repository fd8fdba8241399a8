"""A step's inputs: this process's images of step s with their draws, made on the host or resident on the device.

Every draw is a pure function of (train.seed, the batch's draw key): timesteps, flips and label drops come from a
host generator seeded by `seed_of(DRAWS, seed, *key)`, the noise from a generator seeded by `seed_of(NOISE, seed,
*key)` on the device that draws it. All are drawn for the key's `draw_size` images and sliced to this process's
`draw_rows`, so any split over processes and accumulation steps takes the same numbers.

Two places, one function (`with_draws`):
  - on the host (`device_data` off): the store's memory-mapped pixels and a CPU noise generator, made one step
    ahead on the prefetch thread and copied to the device from pinned memory;
  - resident (`device_data` on, a GPU with the prepared store): the training split's uint8 pixels copied to the
    device once (CIFAR-10: 150 MB) and gathered there by the step's ids, the noise drawn there. Ids, labels,
    timesteps, flips, label drops and captions are the host path's very numbers; the noise comes from the same seed
    on the device's generator (on a CPU that is the host path exactly).
"""

from __future__ import annotations

import torch

from denoiser.data import StepBatch, TrainingData, seed_of
from denoiser.data.order import DRAWS, NOISE
from denoiser.diffusion import Diffusion
from denoiser.model.text import WordHashTokenizer
from denoiser.pixels import to_model_range
from denoiser.train.config import RunConfig

__all__ = ["TOKEN_KEYS", "with_draws", "to_device", "StepInputs"]

TOKEN_KEYS = ("input_ids", "ngram_mask", "attention_mask")  # a text model's batch ends with its captions' tokens


def with_draws(batch: StepBatch, diffusion: Diffusion, cfg: RunConfig, conditional: bool,
               tokenizer: WordHashTokenizer | None = None, device: torch.device | str = "cpu",
               resident: torch.Tensor | None = None) -> tuple[torch.Tensor, ...]:
    """Ids, images in [-1, 1], labels, noise and timesteps of a StepBatch, then for a text model (`tokenizer`) its
    captions' tokens (TOKEN_KEYS; a dropped caption is "": padding only, no condition). The noise is drawn on
    `device`, and with `resident` ((N, 3, S, S) uint8 on `device`, the training split) the pixels are gathered there
    by the batch's ids; everything else stays on the host."""
    n, rows = batch.draw_size, batch.draw_rows
    gen = torch.Generator().manual_seed(seed_of(DRAWS, cfg.train.seed, *batch.draw_key))
    timesteps = diffusion.sample_timesteps(n, gen)[rows]
    flip = (torch.rand(n, generator=gen) < 0.5)[rows]
    drop = (torch.rand(n, generator=gen) < cfg.train.class_dropout)[rows]
    noise_gen = torch.Generator(device).manual_seed(seed_of(NOISE, cfg.train.seed, *batch.draw_key))
    shape = (n, *batch.pixels.shape[1:])  # (draw_size, 3, S, S)
    noise = torch.randn(shape, generator=noise_gen, device=device)[to_device(rows, device)]
    pixels = batch.pixels if resident is None else resident[to_device(batch.ids, device)]
    x0 = to_model_range(pixels)
    if cfg.data.random_flip:
        x0 = torch.where(to_device(flip, x0.device)[:, None, None, None], x0.flip(-1), x0)
    labels = batch.labels
    if conditional:
        labels = torch.where(drop, cfg.model["num_class_embeds"], labels)  # the "no class" row
    if tokenizer is None:
        return batch.ids, x0, labels, noise, timesteps
    if batch.captions is None:
        raise ValueError("this text model's data gave no captions: set data.caption_columns to the data's text columns")
    tokens = tokenizer(batch.captions)
    return (batch.ids, x0, labels, noise, timesteps, *(tokens[k] for k in TOKEN_KEYS))


def to_device(t: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """A host tensor on `device`; to a GPU from pinned memory, so that the copy waits for neither side (a copy from
    pageable memory waits for the GPU's queue to reach it)."""
    device = torch.device(device)
    if device.type != "cuda" or t.device == device:
        return t.to(device)
    return t.pin_memory().to(device, non_blocking=True)


class StepInputs:
    """`inputs(step)`: this process's inputs of a step, as `with_draws` gives them, on the training device.

    device_data None picks resident for a GPU with the store; a stream always reads on the host."""

    def __init__(self, data: TrainingData, diffusion: Diffusion, cfg: RunConfig, conditional: bool,
                 tokenizer: WordHashTokenizer | None, device: torch.device):
        self.data, self.diffusion, self.cfg, self.conditional, self.tokenizer = data, diffusion, cfg, conditional, tokenizer
        self.device = device
        wanted = cfg.train.device_data
        if wanted is None:
            wanted = device.type == "cuda"
        self.resident = None
        if wanted and not data.streamed:
            self.resident = data.train.in_memory().images.to(device)  # (N, 3, S, S) uint8, copied once
        self.draw_device = device if self.resident is not None else torch.device("cpu")

    def __call__(self, step: int) -> tuple[torch.Tensor, ...]:
        batch = with_draws(self.data.batch(step), self.diffusion, self.cfg, self.conditional, self.tokenizer,
                           self.draw_device, self.resident)
        if self.device.type != "cuda":
            return batch
        ids, *rest = batch  # the ids stay on the host: the loop's count of images seen
        return ids, *(to_device(v, self.device) for v in rest)

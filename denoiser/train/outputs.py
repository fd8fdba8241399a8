"""What a run writes besides checkpoints: the exported (EMA) weights, sample grids and FID during training.

Split from the loop (denoiser/train/loop.py) so that it reads as its steps; every function here takes the model and an EMA
and leaves the training state alone.
"""

from __future__ import annotations

import functools
import json
import logging
from pathlib import Path

from diffusers.training_utils import EMAModel

from denoiser.atomic import atomic_path
from denoiser.diffusion import Diffusion
from denoiser.image_io import save_grid, save_png
from denoiser.model.text import HashTextEncoder, PromptedUNet, WordHashTokenizer
from denoiser.model.unet import UNet
from denoiser.pictures import loss_curve
from denoiser.pixels import to_uint8
from denoiser.request import BUILT_IN
from denoiser.sampling.pipeline import save_pipeline
from denoiser.train.config import RunConfig
from denoiser.train.run_dir import read_losses

__all__ = ["export", "sample_grid", "evaluate_fid", "validation_captions"]

logger = logging.getLogger("denoiser.train.command")


def export(model: UNet | PromptedUNet, ema: EMAModel | None) -> tuple[UNet, HashTextEncoder | None]:
    """Plain fp32 copies of the trained UNet and text encoder (None: not a text model), with the EMA weights when
    EMA is on (it covers both), contiguous, in eval mode."""
    model = getattr(model, "_orig_mod", model)  # torch.compile wrapper
    if isinstance(model, PromptedUNet):
        final = PromptedUNet(UNet.from_config(model.unet.config), HashTextEncoder.from_config(model.text_encoder.config))
    else:
        final = UNet.from_config(model.config)
    final.load_state_dict({k: v.detach().float().contiguous() for k, v in model.state_dict().items()})
    if ema is not None:
        ema.copy_to(final.parameters())
    final.eval()
    return (final.unet, final.text_encoder) if isinstance(final, PromptedUNet) else (final, None)


def sample_grid(model: UNet | PromptedUNet, ema: EMAModel | None, diffusion: Diffusion, cfg: RunConfig, out: Path,
                 step: int, prompts: list[str] | None = None, tokenizer: WordHashTokenizer | None = None) -> None:
    """A fixed-seed grid from the (EMA) weights, through the core every door samples with (`resolve`/`run`: the
    built-in sampler, `train.sample_steps`, seed 0, unguided), and the loss curve so far. A class model draws its
    classes spread over the grid; a text model draws `prompts` (the data's class names), cycled, through
    `tokenizer` (the run's; by default one from `cfg.text`)."""
    from denoiser.folders.model_dir import LoadedModel, TextModel
    from denoiser.request import UNGUIDED, SampleRequest
    from denoiser.sampling.plan import resolve, run

    device = next(model.parameters()).device
    final, text_encoder = export(model, ema)
    final = final.to(device)
    n = cfg.train.num_sample_images
    text, grid = None, None
    if text_encoder is not None:
        names = prompts or [""]
        grid = [names[k % len(names)] for k in range(n)]
        text = TextModel(_run_tokenizer(cfg, tokenizer), text_encoder.to(device))
    request = SampleRequest(num_images=n, classes="spread" if final.config.num_class_embeds else None, seed=0,
                            scheduler=BUILT_IN["scheduler"], steps=cfg.train.sample_steps, prompts=grid,
                            guidance=UNGUIDED)
    images = run(resolve(request, LoadedModel.of(final, diffusion.noise_schedule, text))).images
    save_grid(images, out / "samples" / f"step-{step:08d}.png", scale=max(1, 64 // final.config.sample_size))
    steps, losses = read_losses(out)
    save_png(loss_curve(steps, losses), out / "loss.png")  # through a temporary file, as the grid


def _run_tokenizer(cfg: RunConfig, tokenizer: WordHashTokenizer | None) -> WordHashTokenizer:
    """The run's tokenizer (its captions' words), or by default one from `cfg.text` (no vocabulary)."""
    return tokenizer if tokenizer is not None else WordHashTokenizer(**cfg.text.tokenizer_args())


@functools.cache
def _inception(device: str):
    """The FID network, loaded and frozen once per run (each evaluation reused to rebuild it)."""
    from denoiser.evaluate.fid import InceptionFeatures

    return InceptionFeatures(device)


def evaluate_fid(accelerator, model: UNet | PromptedUNet, ema, diffusion: Diffusion, cfg: RunConfig, val_ds, out: Path,
                 step: int, tokenizer: WordHashTokenizer | None = None, classes: list[str] | None = None) -> None:
    """FID-N of the (EMA) weights against the reference; fid.csv, tensorboard, and best-model/ with keep_best: a
    folder like the run's model/ (its class names `classes`; a text model's encoder and `tokenizer`). A class model
    samples its classes spread over the images; a text model, the validation images' own captions, cycled (no
    caption: unconditioned); an unconditional model, as it is."""
    from denoiser.evaluate.fid import fid_of_images, reference_statistics
    from denoiser.folders.model_dir import LoadedModel, TextModel
    from denoiser.request import SampleRequest
    from denoiser.sampling.plan import resolve, run

    train_cfg = cfg.train
    final, text_encoder = export(model, ema)
    device = next(model.parameters()).device
    final = final.to(device)
    extractor = _inception(str(device))
    reference = Path(train_cfg.fid_reference) if train_cfg.fid_reference else out / "fid-reference.safetensors"
    if reference.is_file():
        ref = reference_statistics(reference)
    else:  # the run's own validation split, computed once
        from denoiser.evaluate.fid import Statistics, features

        ref = Statistics.of(features(val_ds.images, extractor, desc="fid reference"))
        ref.save(reference, source=f"validation split of {cfg.data.path or cfg.data.dataset}")
    text, prompts = None, None
    if text_encoder is not None:
        tokenizer = _run_tokenizer(cfg, tokenizer)
        text = TextModel(tokenizer, text_encoder.to(device))
        names = validation_captions(val_ds) or [""]
        prompts = [names[k % len(names)] for k in range(train_cfg.fid_samples)]
    spread = "spread" if final.config.num_class_embeds else None
    request = SampleRequest(num_images=train_cfg.fid_samples, classes=spread, seed=0, scheduler=BUILT_IN["scheduler"],
                            steps=train_cfg.sample_steps, prompts=prompts)
    images = to_uint8(run(resolve(request, LoadedModel.of(final, diffusion.noise_schedule, text))).images)
    score = fid_of_images(images, ref, extractor)
    accelerator.log({"fid": score}, step=step)
    history = out / "fid.csv"
    previous = [float(line.split(",")[1]) for line in history.read_text().splitlines()[1:]] if history.is_file() else []
    if not history.is_file():
        history.write_text("step,fid,num_samples\n")
    with open(history, "a") as f:
        f.write(f"{step},{score:.4f},{train_cfg.fid_samples}\n")
    logger.warning("step %d: FID-%d %.2f", step, train_cfg.fid_samples, score)
    if train_cfg.keep_best and (not previous or score < min(previous)):
        with atomic_path(out / "best-model") as tmp:  # the model and its score replace the last best together
            save_pipeline(final.cpu(), diffusion.noise_schedule, tmp, classes=classes,
                          text_encoder=None if text_encoder is None else text_encoder.cpu(), tokenizer=tokenizer)
            (tmp / "fid.json").write_text(json.dumps({"step": step, "fid": score, "num_samples": train_cfg.fid_samples}))


def validation_captions(val_ds) -> list[str]:
    """Each validation image's first caption (its first candidate's first text; [] without text): the prompts a text
    model's FID samples with, so that its images and the reference are of the same words."""
    table = getattr(val_ds, "candidates", None) if val_ds is not None else None
    if table is None:
        return []
    return [groups[0][0] if groups and groups[0] else "" for groups in table[range(len(table))]]

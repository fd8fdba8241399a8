"""The training loop, through Hugging Face Accelerate: one CPU to many GPUs with the same command.

    denoiser train --config configs/tiny.yaml
    accelerate launch -m denoiser.train --config configs/cifar10-small.yaml   # DDP on every GPU

Determinism is by construction, not by restoring hidden state. The data gives each process its images of
step s (`denoiser.data.open_training_data`, which tells the store's order from a stream's), and says which
draws they take: noise, timesteps, flips and label drops come from a generator seeded by the batch's draw key.
With the store that is the whole global batch's draws, keyed by s, each process and accumulation step taking
its slice: so P processes × A accumulation steps with micro-batch B/(P·A) compute what one process with batch B
computes. A stream's process draws for its own images, keyed by (s, rank). Either way a resumed run continues
the very same streams. One exception: dropout masks come from each process's torch seed, set from (seed, step,
rank), so with model.dropout > 0 runs on different process counts agree in distribution only.

Each step's batch is made one step ahead on a thread (denoiser/data/prefetch.py).

`train.batch_size` is the global batch per optimizer step; the LR schedule and EMA count optimizer
steps only, so both are right under accumulation and any number of processes.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import logging
import os
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from accelerate import Accelerator, PartialState
from accelerate.utils import ProjectConfiguration
from diffusers.optimization import get_scheduler
from diffusers.training_utils import EMAModel
from tqdm.auto import tqdm

from denoiser import checkpoint as ckpt
from denoiser.config import RunConfig, load_config
from denoiser.data import StepBatch, TrainingData, open_training_data, seed_of
from denoiser.data.order import DRAWS, DROPOUT
from denoiser.data.prefetch import Prefetcher
from denoiser.data.training import per_process_batch
from denoiser.diffusion import Diffusion
from denoiser.fast import malloc
from denoiser.fast.groupnorm import default_channels_last
from denoiser.image_io import save_grid
from denoiser.init_from import init_text_encoder, load_init_weights, load_into
from denoiser.pipeline import save_pipeline
from denoiser.pixels import to_model_range, to_uint8
from denoiser.run_dir import prepare_output_dir, read_losses, record_loss, truncate_losses, write_run_info
from denoiser.sample import make_sampler, sample
from denoiser.text import HashTextEncoder, PromptedUNet, WordHashTokenizer
from denoiser.unet import UNet
from denoiser.visualize import loss_curve

__all__ = ["train", "TrainLoop", "TrainingError", "add_train_arguments", "cmd_train", "main"]

logger = logging.getLogger("denoiser.train")  # by name: under `-m denoiser.train`, __name__ is "__main__"


class TrainingError(RuntimeError):
    pass


@dataclass
class _Stop:
    signum: int | None = None
    handlers: dict = field(default_factory=dict)

    def install(self) -> None:
        for s in (signal.SIGTERM, signal.SIGINT):
            self.handlers[s] = signal.signal(s, self._handle)

    def _handle(self, signum, frame) -> None:
        self.signum = signum

    def restore(self) -> None:
        for s, h in self.handlers.items():
            signal.signal(s, h)


def _check_data(cfg: RunConfig, data: TrainingData) -> None:
    """The data against the run: at least one batch, no more classes than the model has rows for."""
    if len(data) < cfg.train.batch_size:
        raise ValueError(f"the training set has {len(data)} images, fewer than one batch ({cfg.train.batch_size}); lower train.batch_size")
    n_cls = cfg.model.get("num_class_embeds")
    if n_cls and len(data.classes) > n_cls:
        raise ValueError(
            f"model.num_class_embeds={n_cls} but the data has {len(data.classes)} classes; "
            f"set model.num_class_embeds: {len(data.classes)}"
        )


def requested_processes(launcher_args: list[str]) -> int | None:
    """The process count an `accelerate launch` command line asks for (--num_processes N, --num-processes=N)."""
    for i, arg in enumerate(launcher_args):
        name, _, value = arg.partition("=")
        if name in ("--num_processes", "--num-processes"):
            value = value or (launcher_args[i + 1] if i + 1 < len(launcher_args) else "")
            return int(value) if value.isdigit() else None
    return None


def launch_warning(world: int, launcher_args: list[str] | None = None) -> str | None:
    """What to say when `accelerate launch` started fewer processes than asked: `--cpu --num_processes 2`
    starts one. The launcher is this process's parent; its command line says what was asked."""
    if launcher_args is None:
        try:
            raw = Path(f"/proc/{os.getppid()}/cmdline").read_bytes()
        except OSError:  # not Linux, or no parent to read: nothing to compare
            return None
        launcher_args = [a.decode(errors="replace") for a in raw.split(b"\0") if a]
    if not any("accelerate" in a for a in launcher_args[:3]):
        return None
    asked = requested_processes(launcher_args)
    if asked is None or asked <= world:
        return None
    fix = (f"`--cpu` starts one process whatever --num_processes says; for {asked} CPU processes run "
           f"`ACCELERATE_USE_CPU=true accelerate launch --multi_gpu --num_processes {asked} ...`"
           if "--cpu" in launcher_args else "check the devices accelerate can see (`accelerate env`)")
    return f"accelerate launch asked for {asked} processes but {world} started: {fix}"


def train(
    cfg: RunConfig, output_dir: str | Path, resume: str | None = None, overwrite: bool = False, init_from: str | None = None
) -> Path:
    """Train a UNet as configured; returns the exported model folder (`output_dir/model`).

    init_from: a model folder (weights/<name>, or a run's model/) whose weights start the run: its EMA
    weights, as exported, with a fresh optimizer, LR warm-up and EMA. Continues a shipped model in a
    later session, or fine-tunes it on another folder. The architecture must match `model:` except for
    the number of classes (the saved class rows are kept, new classes start as the saved "no class" row,
    see `denoiser.init_from.adapt_classes`); the objective (`diffusion:`) may change, e.g. ε- to v-prediction.
    """
    return TrainLoop(cfg, Path(output_dir), resume, overwrite, init_from).run()


class TrainLoop:
    """One run as named steps (improved-diffusion's TrainLoop): the set-up in `__init__`, then `run`
    repeats `run_step`, `log` and `periodic_work` (sample grid, FID, checkpoint, the agreement to stop)
    and ends with `finish` (export and summary).

    The order of the set-up is part of the result: the model is built right after `torch.manual_seed`,
    and each step reseeds before drawing, so a resumed run continues the same random streams.
    """

    def __init__(self, cfg: RunConfig, out: Path, resume: str | None, overwrite: bool, init_from: str | None):
        if init_from is not None and resume is not None:
            raise ValueError("--init-from starts a new run and --resume continues one: pass only one of them")
        init_weights = load_init_weights(cfg, init_from) if init_from is not None else None
        self.cfg, self.train_cfg, self.out = cfg, cfg.train, out
        self.accelerator = Accelerator(
            mixed_precision=self.train_cfg.mixed_precision,
            log_with=self.train_cfg.report_to,
            project_config=ProjectConfiguration(project_dir=str(out), logging_dir=str(out / "logs")),
        )
        acc = self.accelerator
        self.world, self.rank, self.is_main = acc.num_processes, acc.process_index, acc.is_main_process
        if self.is_main and (warning := launch_warning(self.world)):
            logger.warning(warning)
        # Everything that can be wrong is checked before the first step.
        resume_dir = ckpt.find_checkpoint(out, resume) if resume else None
        if resume == "latest" and resume_dir is None and self.is_main:
            logger.warning("--resume latest: no checkpoint under %s yet; starting a new run", out / "checkpoints")
        if self.is_main:
            prepare_output_dir(out, cfg, resuming=resume_dir is not None, overwrite=overwrite)
        acc.wait_for_everyone()
        # images per process and accumulation step (checked before anything is read)
        self.micro = per_process_batch(cfg.train.batch_size, self.world, cfg.train.gradient_accumulation_steps)
        model = self._build_model(init_weights, init_from)
        unet = model.unet if isinstance(model, PromptedUNet) else model
        t = cfg.train
        self.data = open_training_data(cfg.data, unet.config.sample_size, seed=t.seed, batch_size=t.batch_size,
                                       accumulation=t.gradient_accumulation_steps, rank=self.rank, world=self.world,
                                       caption_dropout=t.caption_dropout)  # captions: where the data carries text
        _check_data(cfg, self.data)
        self._build_optimizer(model)
        self.step = self._resume(resume_dir)

    def _build_model(self, init_weights: dict[str, torch.Tensor] | None, init_from: str | None) -> UNet | PromptedUNet:
        """The seeded (or initialised) UNet in its training layout; for a text model, paired with its text encoder."""
        train_cfg = self.train_cfg
        torch.manual_seed(train_cfg.seed)
        unet = UNet(**self.cfg.model)
        if init_weights is not None:
            fresh = load_into(unet, init_weights)  # only cross-attention may be missing: a class model gaining text
            if self.is_main:
                logger.warning("initialised from %s%s", init_from, f" ({len(fresh)} cross-attention tensors start fresh)" if fresh else "")
        self.conditional = bool(unet.config.num_class_embeds)
        self.channels_last = train_cfg.channels_last
        if self.channels_last is None:
            self.channels_last = default_channels_last(self.accelerator.device, train_cfg.mixed_precision)
        if self.channels_last:
            unet = unet.to(memory_format=torch.channels_last)
        if train_cfg.gradient_checkpointing:
            unet.enable_gradient_checkpointing()
        self.tokenizer = None
        if self.cfg.prompted:  # a text model: the UNet and its text encoder train together, from the data's captions
            self.tokenizer = WordHashTokenizer(**self.cfg.text.tokenizer_args())
            text_encoder = HashTextEncoder(**self.cfg.text.encoder_args())
            if init_from is not None and init_text_encoder(text_encoder, init_from) and self.is_main:
                logger.warning("text encoder initialised from %s", init_from)
            return PromptedUNet(unet, text_encoder)
        return unet

    def _build_optimizer(self, unet: UNet | PromptedUNet) -> None:
        """Objective, AdamW, LR schedule and EMA; the model and optimizer prepared by Accelerate."""
        train_cfg, acc = self.train_cfg, self.accelerator
        self.diffusion = Diffusion.from_config(self.cfg.diffusion)
        optimizer = torch.optim.AdamW(
            unet.parameters(), lr=train_cfg.lr, betas=(train_cfg.adam_beta1, train_cfg.adam_beta2), weight_decay=train_cfg.weight_decay,
            fused=acc.device.type in ("cpu", "cuda"),  # one kernel for all parameters: same update, 4x faster on CPU
        )
        # Stepped by us once per optimizer step (not prepared: Accelerate would step it once per process).
        self.lr_scheduler = get_scheduler(
            train_cfg.lr_scheduler, optimizer, num_warmup_steps=train_cfg.lr_warmup_steps, num_training_steps=train_cfg.max_steps
        )
        self.ema = None
        if train_cfg.ema:
            self.ema = EMAModel(
                unet.parameters(), decay=train_cfg.ema_max_decay, use_ema_warmup=True, inv_gamma=train_cfg.ema_inv_gamma,
                power=train_cfg.ema_power, model_cls=UNet, model_config=getattr(unet, "unet", unet).config,
            )
        model_fwd = torch.compile(unet) if train_cfg.compile else unet
        self.model, self.optimizer = acc.prepare(model_fwd, optimizer)
        if self.ema is not None:
            self.ema.to(acc.device)

    def _resume(self, resume_dir: Path | None) -> int:
        """The step to start at: a checkpoint's state loaded (loss.csv cut back to it), else 0; run_info and trackers."""
        step = 0
        if resume_dir is not None:
            state = ckpt.load_checkpoint(self.accelerator, resume_dir, self.ema)
            self.lr_scheduler.load_state_dict(state["lr_scheduler"])
            step = state["step"]
            if self.is_main:
                truncate_losses(self.out, step)
                if self.cfg.data.streaming and state.get("world_size", self.world) != self.world:
                    logger.warning("this stream ran on %d processes and resumes on %d: each process's shards, and so the "
                                   "order of the data, differ from here on", state["world_size"], self.world)
            logger.info("resumed from %s at step %d", resume_dir, step)
        if self.is_main:
            ckpt.remove_partial(self.out)
            write_run_info(self.out, self.cfg, self.world)
            self.accelerator.init_trackers("denoiser", config=_flat_hparams(self.cfg))
        self.accelerator.wait_for_everyone()
        return step

    def run(self) -> Path:
        """Steps to train.max_steps (or the time limit), then `finish`; a signal saves a checkpoint and exits."""
        stop = _Stop()
        stop.install()
        self.bar = tqdm(total=self.train_cfg.max_steps, initial=self.step, disable=not self.is_main, desc="train", dynamic_ncols=True)
        self.seen = torch.zeros(2, dtype=torch.float64)  # images seen by this rank, checksum of their indices
        self.tic, self.tic_step = time.perf_counter(), self.step
        self.waited = 0.0  # seconds this rank waited for its input (images, noise) in this sitting
        self.batches = Prefetcher(self._batch)  # step k+1's batch is made while step k computes
        self.started, self.first_step = time.monotonic(), self.step
        try:
            while self.step < self.train_cfg.max_steps:
                loss_mean, grad_norm = self.run_step()
                self.log(loss_mean, grad_norm)
                if self.periodic_work(stop.signum):
                    break
        except BaseException:
            self.accelerator.end_training()
            raise
        finally:
            self.bar.close()
            self.batches.close()
            self.data.close()
            stop.restore()
        return self.finish()

    def run_step(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """One optimizer step on the global batch: this process's slices, accumulated. Returns the loss
        (mean over processes) and the gradient norm before clipping (None without clipping)."""
        train_cfg, acc, A = self.train_cfg, self.accelerator, self.train_cfg.gradient_accumulation_steps
        torch.manual_seed(seed_of(DROPOUT, train_cfg.seed, self.step, self.rank))  # dropout stream: a function of (step, rank)
        tic = time.perf_counter()
        batch = self.batches.get(self.step)  # this process's images of the step, with their draws
        self.waited += time.perf_counter() - tic
        self.model.train()
        loss_sum = torch.zeros((), device=acc.device)
        for a in range(A):
            loss_sum += self._micro_step(batch, a) / A
        grad_norm = None
        if train_cfg.max_grad_norm is not None:
            grad_norm = acc.clip_grad_norm_(self.model.parameters(), train_cfg.max_grad_norm)
        loss_mean = acc.reduce(loss_sum, "mean")
        if not torch.isfinite(loss_mean):
            raise TrainingError(
                f"loss is {float(loss_mean)} at step {self.step + 1}; stopped without saving this state. "
                f"The last good checkpoint is {_last(self.out)}; lower train.lr or use mixed_precision: no"
            )
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        if not acc.optimizer_step_was_skipped:  # fp16 overflow: no real step, so no LR/EMA step
            self.lr_scheduler.step()
            if self.ema is not None:
                self.ema.step(acc.unwrap_model(self.model).parameters())
        self.step += 1
        return loss_mean, grad_norm

    def _batch(self, step: int) -> tuple[torch.Tensor, ...]:
        """This process's images of step `step` with their draws (on the prefetch thread); in pinned memory for an
        asynchronous copy to a GPU."""
        batch = _with_draws(self.data.batch(step), self.diffusion, self.cfg, self.conditional, self.tokenizer)
        return tuple(v.pin_memory() for v in batch) if self.accelerator.device.type == "cuda" else batch

    def _micro_step(self, batch: tuple[torch.Tensor, ...], a: int) -> torch.Tensor:
        """Forward and backward on this process's slice of accumulation step `a`; gradients sync on the last."""
        acc, A, micro = self.accelerator, self.train_cfg.gradient_accumulation_steps, self.micro
        idx, x0, labels, noise, timesteps, *tokens = (v[a * micro : (a + 1) * micro] for v in batch)  # this process's [accum][micro]
        text = dict(zip(TOKEN_KEYS, (v.to(acc.device, non_blocking=True) for v in tokens)))  # a text model's prompt tokens
        self.seen += torch.tensor([micro, float(idx.double().mul(self.step + 1).sum())], dtype=torch.float64)
        x0 = x0.to(acc.device, non_blocking=True, memory_format=torch.channels_last if self.channels_last else torch.preserve_format)
        labels = labels.to(acc.device, non_blocking=True)
        ctx = acc.no_sync(self.model) if a < A - 1 else contextlib.nullcontext()
        with ctx:
            loss = self.diffusion.training_loss(
                self.model, x0, labels if self.conditional else None, noise=noise.to(x0, non_blocking=True),
                timesteps=timesteps.to(x0.device, non_blocking=True),
                snr_gamma=self.train_cfg.snr_gamma, unet_kwargs=text,
            )
            acc.backward(loss / A)
        return loss.detach()

    def log(self, loss_mean: torch.Tensor, grad_norm: torch.Tensor | None) -> None:
        """Progress bar and loss.csv every step, tensorboard every train.log_every steps: main process only."""
        if not self.is_main:
            return
        train_cfg, step = self.train_cfg, self.step
        self.bar.update(1)
        elapsed = time.perf_counter() - self.tic
        ips = (step - self.tic_step) * train_cfg.batch_size / max(elapsed, 1e-9)
        wait = self.waited / max(elapsed, 1e-9)  # fraction of the step time spent waiting for data
        self.bar.set_postfix(loss=f"{float(loss_mean):.4f}", img_s=f"{ips:.1f}", data=f"{wait:.0%}", refresh=False)
        record_loss(self.out, step, float(loss_mean))
        if step % train_cfg.log_every == 0 or step == train_cfg.max_steps:
            logs = {"loss": float(loss_mean), "lr": self.lr_scheduler.get_last_lr()[0], "img_per_s": ips, "data_wait": wait}
            if grad_norm is not None:
                logs["grad_norm"] = float(grad_norm)
            self.accelerator.log(logs, step=step)

    def periodic_work(self, signum_here: int | None) -> bool:
        """Sample grid, FID and checkpoint when due; True when the time limit ends the run.

        signum_here: the signal this process caught, if any. Every rank must agree on stopping: (signal,
        out of time) are reduced with max, so a signal to one process saves a checkpoint on all and
        exits them all."""
        train_cfg, acc, step = self.train_cfg, self.accelerator, self.step
        flags = torch.tensor([float(signum_here or 0), float(_out_of_time(train_cfg, self.started))], device=acc.device)
        signum, out_of_time = (int(v) for v in acc.reduce(flags, "max"))
        last = step == train_cfg.max_steps or out_of_time
        if train_cfg.sample_every and (step % train_cfg.sample_every == 0 or last):
            if self.is_main:
                _sample_grid(acc.unwrap_model(self.model), self.ema, self.diffusion, self.cfg, self.out, step,
                             list(self.data.classes))
            acc.wait_for_everyone()
        if train_cfg.fid_every and (step % train_cfg.fid_every == 0 or last):
            if self.is_main:
                _evaluate_fid(acc, acc.unwrap_model(self.model), self.ema, self.diffusion, self.cfg, self.data.validation, self.out, step)
            acc.wait_for_everyone()
        if step % train_cfg.checkpoint_every == 0 or last or signum:
            self.save()
        if signum:
            if self.is_main:
                logger.warning("stopped by signal %d at step %d; checkpoint saved. Continue with --resume latest", signum, step)
            raise SystemExit(128 + signum)
        if out_of_time:
            logger.warning("train.time_limit_minutes=%s reached at step %d; exporting", train_cfg.time_limit_minutes, step)
        return bool(out_of_time)

    def save(self) -> None:
        """A checkpoint of this step (every process writes its part), then the oldest pruned."""
        state = {"step": self.step, "lr_scheduler": self.lr_scheduler.state_dict(), "world_size": self.world}
        ckpt.save_checkpoint(self.accelerator, self.out, self.step, state, self.ema)
        if self.is_main:
            ckpt.prune_checkpoints(self.out, self.train_cfg.keep_checkpoints)

    def finish(self) -> Path:
        """The (EMA) weights exported as a pipeline to out/model, and train_summary.json; returns out/model."""
        acc = self.accelerator
        all_seen = acc.gather(self.seen.to(acc.device)[None]).cpu()  # (world, 2)
        skipped = None
        if self.data.streamed:  # items each rank skipped (could not decode): (world,)
            skipped = acc.gather(torch.tensor([len(self.data.skipped)], device=acc.device)).cpu()
        model_dir = self.out / "model"
        if self.is_main:
            final, text_encoder = _export(acc.unwrap_model(self.model), self.ema)
            names = list(self.data.classes)
            classes = names if len(names) == (final.config.num_class_embeds or 0) else None
            save_pipeline(final, self.diffusion.scheduler, model_dir, classes=classes, text_encoder=text_encoder,
                          tokenizer=self.tokenizer)
            (self.out / "train_summary.json").write_text(json.dumps(self._summary(all_seen, skipped), indent=1))
        acc.wait_for_everyone()
        acc.end_training()
        return model_dir

    def _summary(self, all_seen: torch.Tensor, skipped: torch.Tensor | None) -> dict:
        """train_summary.json: images seen (per rank, with a checksum of their indices: store rows, or a stream's global
        item numbers), LR, this sitting's speed; a stream adds the items each rank skipped in this sitting."""
        train_cfg, step = self.train_cfg, self.step
        per_rank = [{"rank": r, "images": int(n), "index_checksum": float(c)} for r, (n, c) in enumerate(all_seen.tolist())]
        if skipped is not None:
            for row, n in zip(per_rank, skipped.tolist()):
                row["skipped"] = int(n)
        return {
            "step": step,
            "images_seen": int(all_seen[:, 0].sum()),
            "per_rank": per_rank,
            "lr": self.lr_scheduler.get_last_lr()[0],
            "validation_images": len(self.data.validation),
            "data_wait": round(self.waited / max(time.perf_counter() - self.tic, 1e-9), 4),  # main process, this sitting
            # this sitting only (a resumed run adds sittings): wall-clock of the loop and its throughput
            "train_seconds": round(time.monotonic() - self.started, 1),
            "images_per_s": round((step - self.first_step) * train_cfg.batch_size / max(time.monotonic() - self.started, 1e-9), 1),
        }


TOKEN_KEYS = ("input_ids", "ngram_mask", "attention_mask")  # a text model's batch ends with its captions' tokens


def _with_draws(batch: StepBatch, diffusion: Diffusion, cfg: RunConfig, conditional: bool,
                tokenizer: WordHashTokenizer | None = None):
    """Ids, images in [-1, 1], labels, noise and timesteps of a StepBatch, then for a text model (`tokenizer`) its
    captions' tokens (TOKEN_KEYS; a dropped caption is "": padding only, no condition). Noise, timesteps, flips and label drops are
    drawn, in that order, for the batch's `draw_size` images from a generator seeded by its draw key, and its images
    take rows `draw_rows`: a pure function of (seed, key), whatever the split over processes and accumulation."""
    gen = torch.Generator().manual_seed(seed_of(DRAWS, cfg.train.seed, *batch.draw_key))
    n, rows = batch.draw_size, batch.draw_rows
    noise = torch.randn((n, *batch.pixels.shape[1:]), generator=gen)[rows]
    timesteps = diffusion.sample_timesteps(n, gen)[rows]
    flip = (torch.rand(n, generator=gen) < 0.5)[rows]
    drop = (torch.rand(n, generator=gen) < cfg.train.class_dropout)[rows]
    x0 = to_model_range(batch.pixels)
    if cfg.data.random_flip:
        x0 = torch.where(flip[:, None, None, None], x0.flip(-1), x0)
    labels = batch.labels
    if conditional:
        labels = torch.where(drop, cfg.model["num_class_embeds"], labels)  # the "no class" row
    if tokenizer is None:
        return batch.ids, x0, labels, noise, timesteps
    if batch.captions is None:
        raise TrainingError("this text model's data gave no captions: set data.caption_columns to the data's text columns")
    tokens = tokenizer(batch.captions)
    return (batch.ids, x0, labels, noise, timesteps, *(tokens[k] for k in TOKEN_KEYS))


def _out_of_time(train_cfg, started: float) -> bool:
    return train_cfg.time_limit_minutes is not None and time.monotonic() - started > 60 * train_cfg.time_limit_minutes


def _last(out: Path) -> str:
    found = ckpt.complete_checkpoints(out)
    return str(found[-1]) if found else "none (no checkpoint yet)"


def _export_unet(unet: UNet, ema: EMAModel | None) -> UNet:
    """A plain fp32 copy of the trained UNet (with the EMA weights when EMA is on), contiguous."""
    return _export(unet, ema)[0]


def _export(model: UNet | PromptedUNet, ema: EMAModel | None) -> tuple[UNet, HashTextEncoder | None]:
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


def _sample_grid(model: UNet | PromptedUNet, ema: EMAModel | None, diffusion: Diffusion, cfg: RunConfig, out: Path,
                 step: int, prompts: list[str] | None = None) -> None:
    """A fixed-seed DDIM grid from the (EMA) weights, and the loss curve so far; a text model draws `prompts`
    (the data's class names), cycled over the grid."""
    device = next(model.parameters()).device
    final, text_encoder = _export(model, ema)
    final = final.to(device)
    scheduler = make_sampler("ddim", diffusion.scheduler.config)
    train_cfg = cfg.train
    labels, text = None, None
    if final.config.num_class_embeds:  # one row per class, as far as the grid has room
        labels = torch.arange(train_cfg.num_sample_images) % final.config.num_class_embeds
    if text_encoder is not None:
        from denoiser.guidance import TextCondition

        names = prompts or [""]
        grid = [names[k % len(names)] for k in range(train_cfg.num_sample_images)]
        tokenizer = WordHashTokenizer(**cfg.text.tokenizer_args())
        text = TextCondition.encode(tokenizer, text_encoder.to(device), grid)
    result = sample(final, scheduler, train_cfg.num_sample_images, train_cfg.sample_steps, seed=0, class_labels=labels,
                    text=text)
    save_grid(result.images, out / "samples" / f"step-{step:08d}.png", scale=max(1, 64 // final.config.sample_size))
    steps, losses = read_losses(out)
    loss_curve(steps, losses).save(out / "loss.png")


@functools.cache
def _inception(device: str):
    """The FID network, loaded and frozen once per run (each evaluation reused to rebuild it)."""
    from denoiser.fid import InceptionFeatures

    return InceptionFeatures(device)


def _evaluate_fid(accelerator, unet, ema, diffusion: Diffusion, cfg: RunConfig, val_ds, out: Path, step: int) -> None:
    """FID-N of the (EMA) weights against the reference; fid.csv, tensorboard, and best-model/ with keep_best."""
    from denoiser.fid import fid_of_images, reference_statistics
    from denoiser.request import SampleRequest
    from denoiser.sampling import resolve, run

    train_cfg = cfg.train
    final = _export_unet(unet, ema).to(unet.device)
    extractor = _inception(str(unet.device))
    reference = Path(train_cfg.fid_reference) if train_cfg.fid_reference else out / "fid-reference.safetensors"
    if reference.is_file():
        ref = reference_statistics(reference)
    else:  # the run's own validation split, computed once
        from denoiser.fid import Statistics, features

        ref = Statistics.of(features(val_ds.images, extractor, desc="fid reference"))
        ref.save(reference, source=f"validation split of {cfg.data.path or cfg.data.dataset}")
    request = SampleRequest(num_images=train_cfg.fid_samples, classes="spread", seed=0, scheduler="ddim", steps=train_cfg.sample_steps)
    images = to_uint8(run(resolve(request, unet=final, scheduler=diffusion.scheduler)).images)
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
        save_pipeline(final.cpu(), diffusion.scheduler, out / "best-model")
        (out / "best-model" / "fid.json").write_text(json.dumps({"step": step, "fid": score, "num_samples": train_cfg.fid_samples}))


def _flat_hparams(cfg: RunConfig) -> dict:
    flat = {}
    for section, values in cfg.to_dict().items():
        for k, v in values.items():
            if isinstance(v, (int, float, str, bool)):
                flat[f"{section}.{k}"] = v
    return flat


# The command line of a run: `denoiser train ...` (the CLI adds these flags to its `train` subcommand)
# and `accelerate launch -m denoiser.train ...` (main below), the same flags and the same behaviour.


def add_train_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of `denoiser train`, which `accelerate launch -m denoiser.train` takes as they are."""
    parser.add_argument("--config", required=True,
                        help="a preset name (tiny, cifar10, emoji, ...; a wrong name lists them) or a YAML file")
    parser.add_argument("--output-dir", default=None, help="run folder (default: runs/<config name>)")
    parser.add_argument("--max-steps", type=int, default=None, help="override train.max_steps")
    parser.add_argument("--resume", default=None, help="'latest' or a checkpoint folder")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a config value, e.g. --set train.lr=1e-4 (repeatable)")
    parser.add_argument("--overwrite", action="store_true", help="start over in an output folder that holds another run")
    parser.add_argument("--init-from", default=None, metavar="MODEL_DIR",
                        help="start from a model folder's weights (e.g. weights/cifar10): fresh optimizer, warm-up; fine-tuning")


def cmd_train(args: argparse.Namespace) -> None:
    """`denoiser train`: the config with its overrides, the run, then where its outputs are (main process)."""
    overrides = list(args.overrides) + ([f"train.max_steps={args.max_steps}"] if args.max_steps else [])
    cfg = load_config(args.config, overrides)
    out = args.output_dir or str(Path("runs") / Path(args.config).stem)
    model_dir = train(cfg, out, resume=args.resume, overwrite=args.overwrite, init_from=args.init_from)
    if PartialState().is_main_process:
        print(f"model: {model_dir}\nrun folder: {out} (samples/, loss.png, logs/ for tensorboard)")


def main(argv: list[str] | None = None) -> int:
    """`accelerate launch -m denoiser.train --config ...`: `denoiser train` as the `denoiser` command runs it
    (logging, malloc settings, errors as `denoiser train: error: ...` with exit status 2)."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    parser = argparse.ArgumentParser(prog="denoiser train")
    add_train_arguments(parser)
    args = parser.parse_args(argv)
    malloc.configure(keep_peak=True)  # every step reuses the last step's memory (denoiser/fast/malloc.py)
    try:
        cmd_train(args)
    except (ValueError, FileNotFoundError) as err:
        print(f"denoiser train: error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

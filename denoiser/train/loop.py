"""The training loop, through Hugging Face Accelerate: one CPU to many GPUs with the same command.

    denoiser train --config configs/tiny.yaml                                  # both run denoiser/train/command.py's
    accelerate launch -m denoiser.train --config configs/cifar10-small.yaml   # command: DDP on every GPU

Determinism is by construction, not by restoring hidden state. The data gives each process its images of
step s (`denoiser.data.open_training_data`, which tells the store's order from a stream's), and says which
draws they take: timesteps, flips, label drops and noise come from generators seeded by the batch's draw key
(denoiser/train/batch.py). With the store that is the whole global batch's draws, keyed by s, each process and
accumulation step taking its slice: so P processes × A accumulation steps with micro-batch B/(P·A) compute what one
process with batch B computes. A stream's process draws for its own images, keyed by (s, rank). Either way a resumed
run continues the very same streams. One exception: dropout masks come from each process's torch seed, set from
(seed, step, rank), so with model.dropout > 0 runs on different process counts agree in distribution only.

A step never waits for the device: its loss and gradient norm stay there and are read every
train.log_every steps, and before anything saves or shows the weights (`read_pending`), which is also where a
non-finite loss stops the run. Each step's batch is made one step ahead on a thread (denoiser/data/prefetch.py);
on a GPU the training split is resident there and the noise drawn there (train.device_data).

`train.batch_size` is the global batch per optimizer step; the LR schedule and EMA count optimizer
steps only, so both are right under accumulation and any number of processes. The command line is
denoiser/train/command.py; the exported model, sample grids and FID are denoiser/train/outputs.py.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from accelerate import Accelerator
from accelerate.utils import ProjectConfiguration
from diffusers.optimization import get_scheduler
from tqdm.auto import tqdm

from denoiser.atomic import atomic_path
from denoiser.data import TrainingData, open_training_data, seed_of
from denoiser.data.order import DROPOUT
from denoiser.data.prefetch import Prefetcher
from denoiser.data.training import per_process_batch
from denoiser.diffusion import Diffusion
from denoiser.fast.groupnorm import default_channels_last
from denoiser.model.text import HashTextEncoder, PromptedUNet, WordHashTokenizer
from denoiser.model.unet import UNet
from denoiser.sampling.pipeline import save_pipeline
from denoiser.train import checkpoint as ckpt
from denoiser.train.batch import TOKEN_KEYS, StepInputs
from denoiser.train.config import RunConfig
from denoiser.train.ema import ema_lengths, make_emas
from denoiser.train.init_from import init_text_encoder, load_init_weights, load_into
from denoiser.train.launch import launch_warning
from denoiser.train.outputs import evaluate_fid, export, sample_grid
from denoiser.train.run_dir import flat_hparams, prepare_output_dir, record_loss, truncate_losses, write_run_info

__all__ = ["train", "TrainLoop", "TrainingError"]

logger = logging.getLogger("denoiser.train.command")  # by name: under `-m denoiser.train`, __name__ is "__main__"


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


def train(
    cfg: RunConfig, output_dir: str | Path, resume: str | None = None, overwrite: bool = False, init_from: str | None = None
) -> Path:
    """Train a UNet as configured; returns the exported model folder (`output_dir/model`).

    init_from: a model folder (weights/<name>, or a run's model/) whose weights start the run: its EMA
    weights, as exported, with a fresh optimizer, LR warm-up and EMA. Continues a shipped model in a
    later session, or fine-tunes it on another folder. The architecture must match `model:` except for
    the number of classes (the saved class rows are kept, new classes start as the saved "no class" row,
    see `denoiser.train.init_from.adapt_classes`); the objective (`diffusion:`) may change, e.g. ε- to v-prediction.
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
        # a text model's tokenizer keeps the words of its training captions, so its folder can tell a prompt's
        # unseen words (WordHashTokenizer.unseen)
        self.tokenizer = WordHashTokenizer(**cfg.text.tokenizer_args(), vocabulary=self.data.caption_texts()) if cfg.prompted else None
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
        if self.cfg.prompted:  # a text model: the UNet and its text encoder train together, from the data's captions
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
        # the run's EMA (exported) and any extra lengths (train.ema_extra_*), foreach-updated (denoiser/train/ema.py)
        self.emas = make_emas(unet.parameters(), train_cfg, UNet, getattr(unet, "unet", unet).config)
        self.ema = self.emas[0] if self.emas else None
        model_fwd = torch.compile(unet, mode=train_cfg.compile_mode) if train_cfg.compile else unet
        self.model, self.optimizer = acc.prepare(model_fwd, optimizer)
        for ema in self.emas:
            ema.to(acc.device)

    def _resume(self, resume_dir: Path | None) -> int:
        """The step to start at: a checkpoint's state loaded (loss.csv cut back to it), else 0; run_info and trackers."""
        step = 0
        if resume_dir is not None:
            state = ckpt.load_checkpoint(self.accelerator, resume_dir, self.emas)
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
            self.accelerator.init_trackers("denoiser", config=flat_hparams(self.cfg))
        self.accelerator.wait_for_everyone()
        return step

    def run(self) -> Path:
        """Steps to train.max_steps (or the time limit), then `finish`; a signal saves a checkpoint and exits."""
        stop = _Stop()
        stop.install()
        self.begin()
        try:
            while self.step < self.train_cfg.max_steps:
                if self.advance(stop.signum):
                    break
        except BaseException:
            self.accelerator.end_training()
            raise
        finally:
            self.end()
            stop.restore()
        return self.finish()

    def begin(self) -> None:
        """This sitting's counters, progress bar and input pipeline (step k+1's batch made while step k computes)."""
        self.bar = tqdm(total=self.train_cfg.max_steps, initial=self.step, disable=not self.is_main, desc="train", dynamic_ncols=True)
        self.seen = torch.zeros(2, dtype=torch.float64)  # images seen by this rank, checksum of their indices
        self.tic, self.tic_step = time.perf_counter(), self.step
        self.waited = 0.0  # seconds this rank waited for its input (images, noise) in this sitting
        self.inputs = StepInputs(self.data, self.diffusion, self.cfg, self.conditional, self.tokenizer, self.accelerator.device)
        self.batches = Prefetcher(self.inputs)
        self.pending: list[tuple[int, torch.Tensor]] = []  # (step, [loss, grad norm]) on the device, not yet read
        self.started, self.first_step = time.monotonic(), self.step

    def advance(self, signum: int | None = None) -> bool:
        """One step, then at a read its periodic work; True when the time limit ends the run."""
        loss_mean, grad_norm = self.run_step()
        self.pending.append((self.step, _stacked(loss_mean, grad_norm)))
        return self.periodic_work(signum)

    def end(self) -> None:
        self.bar.close()
        self.batches.close()
        self.data.close()

    def run_step(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """One optimizer step on the global batch: this process's slices, accumulated. Returns the loss
        (mean over processes) and the gradient norm before clipping (None without clipping), on the device:
        nothing here waits for the device (fp16's loss scaler aside), `read_pending` checks them."""
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
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        if not acc.optimizer_step_was_skipped:  # fp16 overflow: no real step, so no LR/EMA step
            self.lr_scheduler.step()
            parameters = list(acc.unwrap_model(self.model).parameters())
            for ema in self.emas:
                ema.step(parameters)
        self.step += 1
        return loss_mean, grad_norm

    def _micro_step(self, batch: tuple[torch.Tensor, ...], a: int) -> torch.Tensor:
        """Forward and backward on this process's slice of accumulation step `a`; gradients sync on the last."""
        acc, A, micro = self.accelerator, self.train_cfg.gradient_accumulation_steps, self.micro
        idx, x0, labels, noise, timesteps, *tokens = (v[a * micro : (a + 1) * micro] for v in batch)  # this process's [accum][micro]
        text = dict(zip(TOKEN_KEYS, (v.to(acc.device, non_blocking=True) for v in tokens)))  # a text model's prompt tokens
        self.seen += torch.stack([torch.tensor(float(micro), dtype=torch.float64), idx.double().mul(self.step + 1).sum()])
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

    def read_pending(self) -> None:
        """The steps since the last read, read from the device at once (the one wait): loss.csv rows, progress and
        tracker logs on the main process; a non-finite loss stops the run before anything of its state is saved."""
        if not self.pending:
            return
        steps = [s for s, _ in self.pending]
        values = torch.stack([v for _, v in self.pending]).cpu().tolist()  # (k, 2): loss, grad norm (nan: none)
        self.pending = []
        for step, (loss, _) in zip(steps, values):
            if not math.isfinite(loss):
                raise TrainingError(
                    f"loss is {loss} at step {step} (read at step {self.step}); stopped without saving this state. "
                    f"The last good checkpoint is {_last(self.out)}; lower train.lr or use mixed_precision: no"
                )
            if self.is_main:
                record_loss(self.out, step, loss)
        if self.is_main:
            self.log(steps[-1], values[-1][0], values[-1][1], len(steps))

    def log(self, step: int, loss: float, grad_norm: float, steps_read: int) -> None:
        """Progress bar, and tracker logs at train.log_every steps (main process)."""
        train_cfg = self.train_cfg
        self.bar.update(steps_read)
        elapsed = time.perf_counter() - self.tic
        ips = (self.step - self.tic_step) * train_cfg.batch_size / max(elapsed, 1e-9)
        wait = self.waited / max(elapsed, 1e-9)  # fraction of the step time spent waiting for data
        self.bar.set_postfix(loss=f"{loss:.4f}", img_s=f"{ips:.1f}", data=f"{wait:.0%}", refresh=False)
        if step % train_cfg.log_every == 0 or step == train_cfg.max_steps:
            logs = {"loss": loss, "lr": self.lr_scheduler.get_last_lr()[0], "img_per_s": ips, "data_wait": wait}
            if not math.isnan(grad_norm):
                logs["grad_norm"] = grad_norm
            self.accelerator.log(logs, step=step)

    def periodic_work(self, signum_here: int | None) -> bool:
        """At a read (every train.log_every steps, and before any work that saves or shows the weights): the
        pending losses read and checked, then sample grid, FID and checkpoint when due; True when the time limit
        ends the run.

        signum_here: the signal this process caught, if any. Every rank must agree on stopping: (signal,
        out of time) are reduced with max, so a signal to one process saves a checkpoint on all and
        exits them all, at the next read."""
        train_cfg, acc, step = self.train_cfg, self.accelerator, self.step
        due = [every and step % every == 0 for every in (train_cfg.sample_every, train_cfg.fid_every, train_cfg.checkpoint_every)]
        if not (any(due) or step % train_cfg.log_every == 0 or step == train_cfg.max_steps):
            return False  # between reads: the host runs ahead of the device
        self.read_pending()
        flags = torch.tensor([float(signum_here or 0), float(_out_of_time(train_cfg, self.started))], device=acc.device)
        signum, out_of_time = (int(v) for v in acc.reduce(flags, "max"))
        last = step == train_cfg.max_steps or out_of_time
        if train_cfg.sample_every and (due[0] or last):
            if self.is_main:
                sample_grid(acc.unwrap_model(self.model), self.ema, self.diffusion, self.cfg, self.out, step,
                            list(self.data.classes), tokenizer=self.tokenizer)
            acc.wait_for_everyone()
        if train_cfg.fid_every and (due[1] or last):
            if self.is_main:
                evaluate_fid(acc, acc.unwrap_model(self.model), self.ema, self.diffusion, self.cfg, self.data.validation, self.out,
                             step, tokenizer=self.tokenizer, classes=self.class_names())
            acc.wait_for_everyone()
        if due[2] or last or signum:
            self.save()
        if signum:
            if self.is_main:
                logger.warning("stopped by signal %d at step %d; checkpoint saved. Continue with --resume latest", signum, step)
            raise SystemExit(128 + signum)
        if out_of_time:
            logger.warning("train.time_limit_minutes=%s reached at step %d; exporting", train_cfg.time_limit_minutes, step)
        return bool(out_of_time)

    def class_names(self) -> list[str] | None:
        """The data's class names, written to the exported folders: those of a model with as many class embeddings."""
        names = list(self.data.classes)
        return names if len(names) == (self.cfg.model.get("num_class_embeds") or 0) else None

    def save(self) -> None:
        """A checkpoint of this step (every process writes its part), then the oldest pruned."""
        state = {"step": self.step, "lr_scheduler": self.lr_scheduler.state_dict(), "world_size": self.world}
        ckpt.save_checkpoint(self.accelerator, self.out, self.step, state, self.emas)
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
            final, text_encoder = export(acc.unwrap_model(self.model), self.ema)
            classes = self.class_names()
            save_pipeline(final, self.diffusion.noise_schedule, model_dir, classes=classes, text_encoder=text_encoder,
                          tokenizer=self.tokenizer)
            for length, ema in zip(ema_lengths(self.train_cfg)[1:], self.emas[1:]):  # each extra length, its own folder
                other, other_text = export(acc.unwrap_model(self.model), ema)
                save_pipeline(other, self.diffusion.noise_schedule, self.out / length.folder, classes=classes,
                              text_encoder=other_text, tokenizer=self.tokenizer)
            with atomic_path(self.out / "train_summary.json") as tmp:
                tmp.write_text(json.dumps(self._summary(all_seen, skipped), indent=1))
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


def _stacked(loss: torch.Tensor, grad_norm: torch.Tensor | None) -> torch.Tensor:
    """(2,) on the device: the step's loss and gradient norm (nan: no clipping), read later in one copy."""
    norm = torch.full_like(loss, math.nan) if grad_norm is None else grad_norm.to(loss)
    return torch.stack([loss.float(), norm.float()])


def _out_of_time(train_cfg, started: float) -> bool:
    return train_cfg.time_limit_minutes is not None and time.monotonic() - started > 60 * train_cfg.time_limit_minutes


def _last(out: Path) -> str:
    found = ckpt.complete_checkpoints(out)
    return str(found[-1]) if found else "none (no checkpoint yet)"

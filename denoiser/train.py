"""The training loop, through Hugging Face Accelerate: one CPU to many GPUs with the same command.

    denoiser train --config configs/tiny.yaml
    accelerate launch -m denoiser.train --config configs/cifar10-small.yaml   # DDP on every GPU

Determinism is by construction, not by restoring hidden state: optimizer step s uses global batch
s of per-epoch seeded permutations, with noise, timesteps, flips and label dropout drawn for the
whole global batch from a generator seeded by (seed, s); each process and accumulation step takes
its slice. So P processes × A accumulation steps with micro-batch B/(P·A) compute what one process
with batch B computes, and a resumed run continues the very same stream. One exception: dropout
masks come from each process's torch seed, set from (seed, step, rank), so with model.dropout > 0
runs on different process counts agree in distribution only.

`train.batch_size` is the global batch per optimizer step; the LR schedule and EMA count optimizer
steps only, so both are right under accumulation and any number of processes.
"""

from __future__ import annotations

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
from accelerate import Accelerator
from accelerate.utils import ProjectConfiguration
from diffusers.optimization import get_scheduler
from diffusers.training_utils import EMAModel
from safetensors.torch import load_file
from tqdm.auto import tqdm

from denoiser import checkpoint as ckpt
from denoiser.config import RunConfig
from denoiser.data import ImageDataset, load_datasets
from denoiser.diffusion import Diffusion
from denoiser.fast.groupnorm import default_channels_last
from denoiser.pipeline import save_pipeline
from denoiser.run_dir import prepare_output_dir, read_losses, record_loss, truncate_losses, write_run_info
from denoiser.sample import make_sampler, sample, save_grid
from denoiser.unet import UNet
from denoiser.visualize import loss_curve

__all__ = ["train", "TrainingError", "batch_indices"]

logger = logging.getLogger(__name__)


class TrainingError(RuntimeError):
    pass


def batch_indices(num_images: int, batch_size: int, step: int, seed: int) -> torch.Tensor:
    """Indices of the global batch of optimizer step `step`: epochs are seeded permutations, last partial batch dropped."""
    per_epoch = num_images // batch_size
    epoch, b = divmod(step, per_epoch)
    perm = torch.randperm(num_images, generator=torch.Generator().manual_seed(seed * 100_003 + epoch))
    return perm[b * batch_size : (b + 1) * batch_size]


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


def _check_setup(cfg: RunConfig, world: int, train_ds: ImageDataset) -> int:
    t = cfg.train
    per_step = world * t.gradient_accumulation_steps
    if t.batch_size % per_step:
        raise ValueError(
            f"train.batch_size={t.batch_size} must be divisible by processes x gradient_accumulation_steps "
            f"= {world} x {t.gradient_accumulation_steps}; pick a multiple of {per_step}"
        )
    micro = t.batch_size // per_step
    if len(train_ds) < t.batch_size:
        raise ValueError(f"the training set has {len(train_ds)} images, fewer than one batch ({t.batch_size}); lower train.batch_size")
    n_cls = cfg.model.get("num_class_embeds")
    if n_cls and len(train_ds.classes) > n_cls:
        raise ValueError(
            f"model.num_class_embeds={n_cls} but the data has {len(train_ds.classes)} classes; "
            f"set model.num_class_embeds: {len(train_ds.classes)}"
        )
    return micro


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
    see `_adapt_classes`); the objective (`diffusion:`) may change, e.g. ε- to v-prediction.
    """
    t = cfg.train
    out = Path(output_dir)
    if init_from is not None and resume is not None:
        raise ValueError("--init-from starts a new run and --resume continues one: pass only one of them")
    init_weights = _init_weights(cfg, init_from) if init_from is not None else None
    accelerator = Accelerator(
        mixed_precision=t.mixed_precision,
        log_with="tensorboard",
        project_config=ProjectConfiguration(project_dir=str(out), logging_dir=str(out / "logs")),
    )
    world, rank, main = accelerator.num_processes, accelerator.process_index, accelerator.is_main_process
    if main and (warning := launch_warning(world)):
        logger.warning(warning)
    # Everything that can be wrong is checked before the first step.
    resume_dir = ckpt.find_checkpoint(out, resume) if resume else None
    if resume == "latest" and resume_dir is None and main:
        logger.warning("--resume latest: no checkpoint under %s yet; starting a new run", out / "checkpoints")
    if main:
        prepare_output_dir(out, cfg, resuming=resume_dir is not None, overwrite=overwrite)
    accelerator.wait_for_everyone()
    torch.manual_seed(t.seed)
    unet = UNet(**cfg.model)
    if init_weights is not None:
        unet.load_state_dict(init_weights)
        if main:
            logger.warning("initialised from %s", init_from)
    train_ds, val_ds = load_datasets(cfg.data, unet.config.sample_size)
    micro = _check_setup(cfg, world, train_ds)
    A = t.gradient_accumulation_steps

    conditional = bool(unet.config.num_class_embeds)
    channels_last = t.channels_last
    if channels_last is None:
        channels_last = default_channels_last(accelerator.device, t.mixed_precision)
    if channels_last:
        unet = unet.to(memory_format=torch.channels_last)
    if t.gradient_checkpointing:
        unet.enable_gradient_checkpointing()
    diffusion = Diffusion.from_config(cfg.diffusion)
    optimizer = torch.optim.AdamW(
        unet.parameters(), lr=t.lr, betas=(t.adam_beta1, t.adam_beta2), weight_decay=t.weight_decay,
        fused=accelerator.device.type in ("cpu", "cuda"),  # one kernel for all parameters: same update, 4x faster on CPU
    )
    # Stepped by us once per optimizer step (not prepared: Accelerate would step it once per process).
    lr_scheduler = get_scheduler(
        t.lr_scheduler, optimizer, num_warmup_steps=t.lr_warmup_steps, num_training_steps=t.max_steps
    )
    ema = None
    if t.ema:
        ema = EMAModel(
            unet.parameters(), decay=t.ema_max_decay, use_ema_warmup=True, inv_gamma=t.ema_inv_gamma,
            power=t.ema_power, model_cls=UNet, model_config=unet.config,
        )
    model_fwd = torch.compile(unet) if t.compile else unet
    model, optimizer = accelerator.prepare(model_fwd, optimizer)
    if ema is not None:
        ema.to(accelerator.device)

    step = 0
    if resume_dir is not None:
        state = ckpt.load_checkpoint(accelerator, resume_dir, ema)
        lr_scheduler.load_state_dict(state["lr_scheduler"])
        step = state["step"]
        if main:
            truncate_losses(out, step)
        logger.info("resumed from %s at step %d", resume_dir, step)
    if main:
        ckpt.remove_partial(out)
        write_run_info(out, cfg, world)
        accelerator.init_trackers("denoiser", config=_flat_hparams(cfg))
    accelerator.wait_for_everyone()

    stop = _Stop()
    stop.install()
    bar = tqdm(total=t.max_steps, initial=step, disable=not main, desc="train", dynamic_ncols=True)
    seen = torch.zeros(2, dtype=torch.float64)  # images seen by this rank, checksum of their indices
    tic, tic_step = time.perf_counter(), step
    started, first_step = time.monotonic(), step
    try:
        while step < t.max_steps:
            torch.manual_seed(t.seed * 1_000_003 + step * 97 + rank)  # dropout stream: a function of (step, rank)
            batch = _step_batch(train_ds, diffusion, cfg, step, conditional)  # the whole global batch
            model.train()
            loss_sum = torch.zeros((), device=accelerator.device)
            for a in range(A):
                mine = slice((a * world + rank) * micro, (a * world + rank + 1) * micro)  # order: [accum][rank][micro]
                idx, x0, labels, noise, timesteps = (v[mine] for v in batch)
                seen += torch.tensor([micro, float(idx.double().mul(step + 1).sum())], dtype=torch.float64)
                x0 = x0.to(accelerator.device, memory_format=torch.channels_last if channels_last else torch.preserve_format)
                labels = labels.to(accelerator.device)
                sync = a == A - 1
                ctx = accelerator.no_sync(model) if not sync else contextlib.nullcontext()
                with ctx:
                    loss = diffusion.training_loss(
                        model, x0, labels if conditional else None, noise=noise.to(x0), timesteps=timesteps.to(x0.device),
                        snr_gamma=t.snr_gamma,
                    )
                    accelerator.backward(loss / A)
                loss_sum += loss.detach() / A
            grad_norm = None
            if t.max_grad_norm is not None:
                grad_norm = accelerator.clip_grad_norm_(model.parameters(), t.max_grad_norm)
            loss_mean = accelerator.reduce(loss_sum, "mean")
            if not torch.isfinite(loss_mean):
                raise TrainingError(
                    f"loss is {float(loss_mean)} at step {step + 1}; stopped without saving this state. "
                    f"The last good checkpoint is {_last(out)}; lower train.lr or use mixed_precision: no"
                )
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            if not accelerator.optimizer_step_was_skipped:  # fp16 overflow: no real step, so no LR/EMA step
                lr_scheduler.step()
                if ema is not None:
                    ema.step(accelerator.unwrap_model(model).parameters())
            step += 1

            if main:
                bar.update(1)
                elapsed = time.perf_counter() - tic
                ips = (step - tic_step) * t.batch_size / max(elapsed, 1e-9)
                bar.set_postfix(loss=f"{float(loss_mean):.4f}", img_s=f"{ips:.1f}", refresh=False)
                record_loss(out, step, float(loss_mean))
                if step % t.log_every == 0 or step == t.max_steps:
                    logs = {"loss": float(loss_mean), "lr": lr_scheduler.get_last_lr()[0], "img_per_s": ips}
                    if grad_norm is not None:
                        logs["grad_norm"] = float(grad_norm)
                    accelerator.log(logs, step=step)
            # Every rank must agree on stopping: reduce (signal, out of time) with max.
            flags = torch.tensor([float(stop.signum or 0), float(_out_of_time(t, started))], device=accelerator.device)
            signum, out_of_time = (int(v) for v in accelerator.reduce(flags, "max"))
            last = step == t.max_steps or out_of_time
            if t.sample_every and (step % t.sample_every == 0 or last):
                if main:
                    _sample_grid(accelerator.unwrap_model(model), ema, diffusion, cfg, out, step)
                accelerator.wait_for_everyone()
            if t.fid_every and (step % t.fid_every == 0 or last):
                if main:
                    _evaluate_fid(accelerator, accelerator.unwrap_model(model), ema, diffusion, cfg, val_ds, out, step)
                accelerator.wait_for_everyone()
            if step % t.checkpoint_every == 0 or last or signum:
                state = {"step": step, "lr_scheduler": lr_scheduler.state_dict(), "world_size": world}
                ckpt.save_checkpoint(accelerator, out, step, state, ema)
                if main:
                    ckpt.prune_checkpoints(out, t.keep_checkpoints)
            if signum:
                if main:
                    logger.warning("stopped by signal %d at step %d; checkpoint saved. Continue with --resume latest", signum, step)
                raise SystemExit(128 + signum)
            if out_of_time:
                logger.warning("train.time_limit_minutes=%s reached at step %d; exporting", t.time_limit_minutes, step)
                break
    except BaseException:
        accelerator.end_training()
        raise
    finally:
        bar.close()
        stop.restore()

    all_seen = accelerator.gather(seen.to(accelerator.device)[None]).cpu()  # (world, 2)
    model_dir = out / "model"
    if main:
        final = _export_unet(accelerator.unwrap_model(model), ema)
        names = list(getattr(train_ds, "classes", None) or [])
        save_pipeline(final, diffusion.scheduler, model_dir, classes=names if len(names) == (final.config.num_class_embeds or 0) else None)
        summary = {
            "step": step,
            "images_seen": int(all_seen[:, 0].sum()),
            "per_rank": [{"rank": r, "images": int(n), "index_checksum": float(c)} for r, (n, c) in enumerate(all_seen.tolist())],
            "lr": lr_scheduler.get_last_lr()[0],
            "validation_images": len(val_ds),
            # this sitting only (a resumed run adds sittings): wall-clock of the loop and its throughput
            "train_seconds": round(time.monotonic() - started, 1),
            "images_per_s": round((step - first_step) * t.batch_size / max(time.monotonic() - started, 1e-9), 1),
        }
        (out / "train_summary.json").write_text(json.dumps(summary, indent=1))
    accelerator.wait_for_everyone()
    accelerator.end_training()
    return model_dir


def _init_weights(cfg: RunConfig, init_from: str) -> dict[str, torch.Tensor]:
    """The fp32 state dict of a model folder, checked against the config's architecture before any work."""
    folder = Path(init_from)
    config_file, weights = folder / "unet" / "config.json", folder / "unet" / "diffusion_pytorch_model.safetensors"
    if not config_file.is_file() or not weights.is_file():
        raise FileNotFoundError(
            f"--init-from {init_from!r} is not a model folder (needs unet/config.json and "
            "unet/diffusion_pytorch_model.safetensors): pass weights/<name> or a run's model/ folder"
        )
    saved = {k: v for k, v in json.loads(config_file.read_text()).items() if not k.startswith("_")}
    with torch.device("meta"):  # the full argument set, defaults included, without allocating weights
        wanted = {k: v for k, v in UNet(**cfg.model).config.items() if not k.startswith("_")}
    differ = sorted(k for k in wanted if k in saved and _norm(saved[k]) != _norm(wanted[k]) and k != "num_class_embeds")
    if differ:
        detail = ", ".join(f"{k}: {saved[k]!r} there, {wanted[k]!r} here" for k in differ)
        raise ValueError(f"--init-from {init_from!r} has another architecture ({detail}); copy its model section into the config")
    state = {k: v.float() for k, v in load_file(str(weights)).items()}
    return _adapt_classes(state, wanted["num_class_embeds"])


def _adapt_classes(state: dict[str, torch.Tensor], num_classes: int | None) -> dict[str, torch.Tensor]:
    """A state dict for `num_classes` classes (None: unconditional) from one saved with another number:
    fine-tuning on a folder with other classes.

    K -> K' classes: class i < K keeps the saved row i (a condition the network already tells apart; which
    old class becomes which new one is arbitrary), classes K..K'-1 start as the saved "no class" row, which
    stays "no class" (rows that start equal barely separate, see the README). Unconditional -> K': rows of
    zeros (nothing is added to the time embedding). K -> unconditional: the null row moves into the time
    embedding's last bias, where it was always added.
    """
    table = state.pop("class_embed.weight", None)  # (K + 1, 4C): row K is "no class"
    bias = state["time_embed.2.bias"]  # (4C,)
    if not num_classes:
        if table is not None:
            state["time_embed.2.bias"] = bias + table[-1]
        return state
    null = table[-1] if table is not None else torch.zeros_like(bias)
    rows = null.expand(num_classes + 1, -1).clone()  # (K' + 1, 4C)
    if table is not None:
        kept = min(num_classes, table.shape[0] - 1)
        rows[:kept] = table[:kept]
    state["class_embed.weight"] = rows
    return state


def _norm(value):
    return list(value) if isinstance(value, (list, tuple)) else value


def _step_batch(ds: ImageDataset, diffusion: Diffusion, cfg: RunConfig, step: int, conditional: bool):
    """Indices, images, labels, noise and timesteps of optimizer step `step`'s whole global batch.

    A pure function of (seed, step): any split over processes and accumulation steps slices the
    same numbers, and a resumed run draws exactly what the uninterrupted one drew.
    """
    t = cfg.train
    B = t.batch_size
    gen = torch.Generator().manual_seed(t.seed * 7_919 + step)
    idx = batch_indices(len(ds), B, step, t.seed)
    x0, labels = ds.batch(idx)
    noise = torch.randn(x0.shape, generator=gen)
    timesteps = diffusion.sample_timesteps(B, gen)
    flip = torch.rand(B, generator=gen) < 0.5
    drop = torch.rand(B, generator=gen) < t.class_dropout
    if cfg.data.random_flip:
        x0 = torch.where(flip[:, None, None, None], x0.flip(-1), x0)
    if conditional:
        labels = torch.where(drop, cfg.model["num_class_embeds"], labels)  # the "no class" row
    return idx, x0, labels, noise, timesteps


def _out_of_time(t, started: float) -> bool:
    return t.time_limit_minutes is not None and time.monotonic() - started > 60 * t.time_limit_minutes


def _last(out: Path) -> str:
    found = ckpt.complete_checkpoints(out)
    return str(found[-1]) if found else "none (no checkpoint yet)"


def _export_unet(unet: UNet, ema: EMAModel | None) -> UNet:
    """A plain fp32 copy of the trained UNet (with the EMA weights when EMA is on), contiguous."""
    unet = getattr(unet, "_orig_mod", unet)  # torch.compile wrapper
    final = UNet.from_config(unet.config)
    final.load_state_dict({k: v.detach().float().contiguous() for k, v in unet.state_dict().items()})
    if ema is not None:
        ema.copy_to(final.parameters())
    return final.eval()


def _sample_grid(unet: UNet, ema: EMAModel | None, diffusion: Diffusion, cfg: RunConfig, out: Path, step: int) -> None:
    """A fixed-seed DDIM grid from the (EMA) weights, and the loss curve so far."""
    final = _export_unet(unet, ema).to(unet.device)
    scheduler = make_sampler("ddim", diffusion.scheduler.config)
    t = cfg.train
    labels = None
    if final.config.num_class_embeds:  # one row per class, as far as the grid has room
        labels = torch.arange(t.num_sample_images) % final.config.num_class_embeds
    result = sample(final, scheduler, t.num_sample_images, t.sample_steps, seed=0, class_labels=labels)
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
    from denoiser.fid import fid_of_images, generate_images, reference_statistics

    t = cfg.train
    final = _export_unet(unet, ema).to(unet.device)
    extractor = _inception(str(unet.device))
    reference = Path(t.fid_reference) if t.fid_reference else out / "fid-reference.safetensors"
    if reference.is_file():
        ref = reference_statistics(reference)
    else:  # the run's own validation split, computed once
        from denoiser.fid import Statistics, features

        ref = Statistics.of(features(val_ds.images, extractor, desc="fid reference"))
        ref.save(reference, source=f"validation split of {cfg.data.path or cfg.data.dataset}")
    images = generate_images(final, diffusion.scheduler.config, t.fid_samples, steps=t.sample_steps, seed=0,
                             progress=False)
    score = fid_of_images(images, ref, extractor)
    accelerator.log({"fid": score}, step=step)
    history = out / "fid.csv"
    previous = [float(line.split(",")[1]) for line in history.read_text().splitlines()[1:]] if history.is_file() else []
    if not history.is_file():
        history.write_text("step,fid,num_samples\n")
    with open(history, "a") as f:
        f.write(f"{step},{score:.4f},{t.fid_samples}\n")
    logger.warning("step %d: FID-%d %.2f", step, t.fid_samples, score)
    if t.keep_best and (not previous or score < min(previous)):
        save_pipeline(final.cpu(), diffusion.scheduler, out / "best-model")
        (out / "best-model" / "fid.json").write_text(json.dumps({"step": step, "fid": score, "num_samples": t.fid_samples}))


def _flat_hparams(cfg: RunConfig) -> dict:
    flat = {}
    for section, values in cfg.to_dict().items():
        for k, v in values.items():
            if isinstance(v, (int, float, str, bool)):
                flat[f"{section}.{k}"] = v
    return flat


def main() -> None:  # `accelerate launch -m denoiser.train ...`
    from denoiser.cli import main as cli_main

    sys.exit(cli_main(["train", *sys.argv[1:]]))


if __name__ == "__main__":
    main()

"""The run folder: resolved config, versions and commit, the loss log — and a guard against mixing runs.

    run_dir/config.yaml        the resolved config (every field, defaults included)
    run_dir/run_info.json      package versions, git commit, processes, start time
    run_dir/loss.csv           step,loss for every optimizer step (drives loss.png)
    (the training images live in a shared store, see denoiser/data/store.py; its path is in the log)
    run_dir/checkpoints/       see checkpoint.py
    run_dir/samples/           fixed-seed sample grids; run_dir/loss.png; run_dir/logs/ (tensorboard)
    run_dir/model/             the exported diffusers pipeline
"""

from __future__ import annotations

import json
import platform
import shutil
import subprocess
import time
from pathlib import Path

import yaml

from denoiser.atomic import atomic_path
from denoiser.train.config import RunConfig

__all__ = ["prepare_output_dir", "write_run_info", "record_loss", "read_losses", "truncate_losses", "flat_hparams"]

# Settings that may change between sittings of the same run without making it a different run.
RESUMABLE_CHANGES = {
    "train.max_steps", "train.checkpoint_every", "train.keep_checkpoints", "train.sample_every",
    "train.log_every", "train.time_limit_minutes", "train.num_sample_images", "train.sample_steps", "train.compile", "train.fid_every", "train.fid_samples",
    "data.num_workers",  # processes preparing the store: the store, and so the run, is the same
    "train.report_to",
}


def _diff(old: dict, new: dict) -> list[str]:
    """Keys whose values differ; a key the old config lacks (added to the package since) counts as its default."""
    defaults = RunConfig().to_dict()
    keys = []
    for section in sorted(set(old) | set(new)):
        a, b = old.get(section) or {}, new.get(section) or {}
        keys += [f"{section}.{k}" for k in sorted(set(a) | set(b))
                 if a.get(k, (defaults.get(section) or {}).get(k)) != b.get(k)]
    return keys


def prepare_output_dir(out: Path, cfg: RunConfig, resuming: bool, overwrite: bool) -> None:
    """Create the run folder, refusing to mix a different config or a finished run into it."""
    out = Path(out)
    saved = out / "config.yaml"
    new = cfg.to_dict()
    if saved.is_file() and not overwrite:
        old = yaml.safe_load(saved.read_text()) or {}
        changed = [k for k in _diff(old, new) if k not in RESUMABLE_CHANGES]
        if changed:
            raise ValueError(
                f"{str(out)!r} holds a run with a different config (differs in: {', '.join(changed)}); "
                "choose another --output-dir, or pass --overwrite to start over there"
            )
        has_ckpt = (out / "checkpoints").is_dir() and any((out / "checkpoints").iterdir())
        if has_ckpt and not resuming:
            raise ValueError(
                f"{str(out)!r} already holds checkpoints of this run; pass --resume latest to continue it, "
                "or --overwrite to start over"
            )
    if overwrite and out.exists():
        for name in ("checkpoints", "samples", "logs", "model", "loss.csv", "loss.png", "train_summary.json", "fid.csv",
                     "best-model", "fid-reference.safetensors"):
            target = out / name
            shutil.rmtree(target, ignore_errors=True) if target.is_dir() else target.unlink(missing_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    with atomic_path(saved) as tmp:
        tmp.write_text(yaml.safe_dump(new, sort_keys=False))


def _git_commit() -> str | None:
    try:
        here = Path(__file__).resolve().parent
        res = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=5)
        return res.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def write_run_info(out: Path, cfg: RunConfig, world_size: int) -> None:
    """Add this sitting's entry (start time, processes, commit, versions) to run_info.json."""
    import accelerate
    import diffusers
    import torch

    info = {
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "processes": world_size,
        "git_commit": _git_commit(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "diffusers": diffusers.__version__,
        "accelerate": accelerate.__version__,
        "platform": platform.platform(),
        "cuda_devices": torch.cuda.device_count(),
    }
    history = out / "run_info.json"
    runs = json.loads(history.read_text()) if history.is_file() else []
    runs.append(info)  # one entry per sitting
    with atomic_path(history) as tmp:  # a sitting killed while writing keeps the earlier sittings' entries
        tmp.write_text(json.dumps(runs, indent=1))


def record_loss(out: Path, step: int, loss: float) -> None:
    with open(Path(out) / "loss.csv", "a") as f:
        f.write(f"{step},{loss:.6g}\n")


def read_losses(out: Path) -> tuple[list[int], list[float]]:
    path = Path(out) / "loss.csv"
    steps, losses = [], []
    if path.is_file():
        for line in path.read_text().splitlines():
            parts = line.split(",")
            if len(parts) == 2:
                try:
                    steps.append(int(parts[0]))
                    losses.append(float(parts[1]))
                except ValueError:
                    continue  # a line cut short by a kill
    return steps, losses


def truncate_losses(out: Path, step: int) -> None:
    """Forget losses logged after `step` (a resumed run repeats those steps)."""
    steps, losses = read_losses(out)
    path = Path(out) / "loss.csv"
    with atomic_path(path) as tmp:
        tmp.write_text("".join(f"{s},{v:.6g}\n" for s, v in zip(steps, losses) if s <= step))


def flat_hparams(cfg) -> dict:
    """The run's config as flat 'section.key' scalars (tensorboard's hparams)."""
    flat = {}
    for section, values in cfg.to_dict().items():
        for k, v in values.items():
            if isinstance(v, (int, float, str, bool)):
                flat[f"{section}.{k}"] = v
    return flat

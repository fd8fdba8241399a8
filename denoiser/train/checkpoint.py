"""Training checkpoints that survive any crash: written to a temporary folder, renamed when complete.

A checkpoint folder `checkpoints/checkpoint-00001000/` holds what `accelerator.save_state` writes
(model as safetensors, optimizer, grad scaler, RNG states; read back with `weights_only=True`),
plus our own `ema.safetensors` (and `ema-1.safetensors`, ... for extra EMA lengths) and `state.json` (step, LR schedule, EMA counters). It only gets its
final name once every file is on disk, so a run killed at any moment never leaves a checkpoint that
`--resume latest` could pick up half-written (denoiser.atomic's temporary sibling and `publish`, taken step by
step because every process writes into the one folder). Nothing here is unpickled.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from safetensors.torch import load_file, save_file

from denoiser.atomic import is_temporary, publish, temp_sibling

__all__ = ["checkpoint_dir", "find_checkpoint", "save_checkpoint", "load_checkpoint", "prune_checkpoints"]

PREFIX = "checkpoint-"
RANKS_TAG = "ranks"  # the temporary folder's tag: one name that every process of the run computes


def checkpoint_dir(output_dir: Path, step: int) -> Path:
    return Path(output_dir) / "checkpoints" / f"{PREFIX}{step:08d}"


def complete_checkpoints(output_dir: Path) -> list[Path]:
    """Complete checkpoints, oldest first (a folder counts only with its state.json)."""
    root = Path(output_dir) / "checkpoints"
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.name.startswith(PREFIX) and (p / "state.json").is_file()]
    return sorted(found, key=lambda p: int(p.name[len(PREFIX) :]))


def find_checkpoint(output_dir: Path, resume: str) -> Path | None:
    """`latest` -> the newest complete checkpoint of `output_dir`, or None when there is none yet (a
    preemptible job passes the same command every time: its first sitting starts fresh); otherwise
    a checkpoint folder path, which must exist."""
    if resume == "latest":
        found = complete_checkpoints(output_dir)
        return found[-1] if found else None
    path = Path(resume)
    if not (path / "state.json").is_file():
        raise FileNotFoundError(
            f"--resume {resume!r} is not a complete checkpoint folder (no state.json); "
            "pass `latest` or a checkpoints/checkpoint-NNNNNNNN folder"
        )
    return path


def remove_partial(output_dir: Path) -> None:
    """Delete temporary folders left by a run killed while writing a checkpoint."""
    root = Path(output_dir) / "checkpoints"
    if root.is_dir():
        for p in root.iterdir():
            if is_temporary(p.name) or (p.name.startswith(PREFIX) and not (p / "state.json").is_file()):
                shutil.rmtree(p, ignore_errors=True)


def _ema_file(k: int) -> str:
    return "ema.safetensors" if k == 0 else f"ema-{k}.safetensors"  # the run's EMA, then its extra lengths


def save_checkpoint(accelerator, output_dir: Path, step: int, state: dict[str, Any], emas: Sequence = ()) -> Path:
    """Every rank calls this. All write into one temporary folder; the main process publishes it once
    state.json, written last, marks it complete. `emas`: the run's EMA first (ema.safetensors, state["ema"]),
    then its extra lengths (ema-1.safetensors, ..., state["ema_extra"])."""
    final = checkpoint_dir(output_dir, step)
    tmp = temp_sibling(final, RANKS_TAG)
    if accelerator.is_main_process:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    accelerator.wait_for_everyone()
    accelerator.save_state(str(tmp), safe_serialization=True)
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        states = []
        for k, ema in enumerate(emas):
            ema_state = ema.state_dict()
            shadow = {f"{i}": p.detach().contiguous().cpu() for i, p in enumerate(ema_state.pop("shadow_params"))}
            save_file(shadow, str(tmp / _ema_file(k)))
            states.append(ema_state)
        if states:
            state = {**state, "ema": states[0], **({"ema_extra": states[1:]} if len(states) > 1 else {})}
        (tmp / "state.json").write_text(json.dumps(state, indent=1))  # written last: marks completeness
        publish(tmp, final)  # an existing checkpoint of this step is replaced only now
    accelerator.wait_for_everyone()
    return final


def load_checkpoint(accelerator, path: Path, emas: Sequence = ()) -> dict[str, Any]:
    """Restore what `save_checkpoint` wrote; returns the state dict (step, LR scheduler, ...)."""
    accelerator.load_state(str(path))
    state = json.loads((path / "state.json").read_text())
    if emas and "ema" not in state:
        raise ValueError(f"{path} has no EMA state, but this run uses EMA; resume with train.ema=false")
    saved = [state["ema"], *state.get("ema_extra", [])] if emas else []
    if len(saved) < len(emas):
        raise ValueError(f"{path} holds {len(saved)} EMA length(s) and this run tracks {len(emas)}: resume with the "
                         "train.ema_extra_decays and train.ema_extra_powers the run started with")
    for k, ema in enumerate(emas):
        shadow = load_file(str(path / _ema_file(k)))
        ema_state = dict(saved[k])
        ema_state["shadow_params"] = [shadow[f"{i}"] for i in range(len(shadow))]
        ema.load_state_dict(ema_state)
        ema.to(accelerator.device)
    return state


def prune_checkpoints(output_dir: Path, keep: int) -> None:
    """Keep the newest `keep` complete checkpoints (main process only)."""
    for old in complete_checkpoints(output_dir)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)

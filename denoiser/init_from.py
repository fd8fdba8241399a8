"""Starting a training run from another model's weights (`denoiser train --init-from FOLDER`): fine-tuning.

The folder's architecture is checked against the config before any work (only the class count may differ),
and the class embedding is adapted to the new number of classes (`adapt_classes`).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file

from denoiser.config import RunConfig
from denoiser.unet import UNet

__all__ = ["load_init_weights", "adapt_classes"]


def load_init_weights(cfg: RunConfig, init_from: str) -> dict[str, torch.Tensor]:
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
    return adapt_classes(state, wanted["num_class_embeds"])


def adapt_classes(state: dict[str, torch.Tensor], num_classes: int | None) -> dict[str, torch.Tensor]:
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

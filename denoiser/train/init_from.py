"""Starting a training run from another model's weights (`denoiser train --init-from FOLDER`): fine-tuning.

The folder's architecture is checked against the config before any work (only the class count may differ, and a
model without cross-attention may gain it), and the class embedding is adapted to the new number of classes
(`adapt_classes`). A class model becoming a text model keeps every weight it had: its cross-attention blocks start
from their own (zero-output) initialisation, so the new model starts as the old one (`load_into`).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file

from denoiser.model.unet import UNet
from denoiser.train.config import RunConfig

__all__ = ["load_init_weights", "adapt_classes", "load_into", "init_text_encoder"]


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
    gains_text = saved.get("cross_attention_dim") is None  # a class model may gain cross-attention; no other change
    differ = sorted(k for k in wanted if k in saved and _norm(saved[k]) != _norm(wanted[k]) and k != "num_class_embeds"
                    and not (k == "cross_attention_dim" and gains_text))
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


def load_into(unet: torch.nn.Module, state: dict[str, torch.Tensor]) -> list[str]:
    """Load `state` into `unet`; only cross-attention weights may be missing (they keep their initialisation).
    Returns the names of those that were missing."""
    missing, unexpected = unet.load_state_dict(state, strict=False)
    wrong = list(unexpected) + [k for k in missing if not _is_cross(k)]
    if wrong:
        raise ValueError(f"--init-from weights do not fit this model: {wrong[:6]}; copy the folder's model section into the config")
    return list(missing)


def _is_cross(key: str) -> bool:
    return ".cross." in key or key.startswith("mid_cross.")


def init_text_encoder(text_encoder: torch.nn.Module, init_from: str) -> bool:
    """Load the folder's text encoder into `text_encoder` when it has one (a text model continued); False when it has
    none (a class model becoming a text model: the encoder starts fresh)."""
    weights = Path(init_from) / "text_encoder" / "diffusion_pytorch_model.safetensors"
    if not weights.is_file():
        return False
    text_encoder.load_state_dict({k: v.float() for k, v in load_file(str(weights)).items()})
    return True


def _norm(value):
    return list(value) if isinstance(value, (list, tuple)) else value

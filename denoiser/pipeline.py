"""Model folders in diffusers pipeline format: written atomically, read with safetensors only.

A model folder is what `DDPMPipeline.save_pretrained` writes (`model_index.json`, `unet/`,
`scheduler/`), so `DiffusionPipeline.from_pretrained(folder)` loads it after `import denoiser`.
"""

from __future__ import annotations

import copy
import json
import shutil
import uuid
from pathlib import Path

import torch
from diffusers import DDPMPipeline, DDPMScheduler, UNet2DModel

from denoiser.unet import UNet

__all__ = ["save_pipeline", "load_model", "resolve_model_dir", "list_models", "WEIGHTS_DIR"]

WEIGHTS_DIR = Path(__file__).resolve().parent.parent / "weights"


def save_pipeline(unet: UNet, scheduler: DDPMScheduler, out_dir: str | Path, dtype: torch.dtype | None = None) -> Path:
    """Write a DDPMPipeline folder to a temporary sibling, then swap it into place.

    An existing folder is only replaced once the new one is complete; `dtype` (e.g. torch.float16)
    shrinks the shipped weights, and `load_model` upcasts them again.
    """
    out = Path(out_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp-{uuid.uuid4().hex[:8]}")
    # safetensors stores contiguous tensors: undo channels-last (on a copy) before saving
    unet = copy.deepcopy(unet).to(memory_format=torch.contiguous_format)
    if dtype is not None:
        unet = unet.to(dtype=dtype)
    DDPMPipeline(unet=unet, scheduler=scheduler).save_pretrained(tmp, safe_serialization=True)
    old = out.with_name(f".{out.name}.old-{uuid.uuid4().hex[:8]}")
    if out.exists():
        out.replace(old)
    tmp.replace(out)
    shutil.rmtree(old, ignore_errors=True)
    return out


def load_model(
    model_dir: str | Path, device: str | torch.device = "cpu", channels_last: bool = True
) -> tuple[UNet, DDPMScheduler]:
    """(UNet in fp32, eval mode; training scheduler) from a pipeline folder. Safetensors only.

    channels_last: store conv weights NHWC, which the CPU and GPU convolution kernels run faster;
    outputs equal the default layout's up to float rounding.
    """
    folder = Path(model_dir)
    if not (folder / "unet" / "config.json").is_file():
        raise FileNotFoundError(
            f"{str(folder)!r} is not a model folder (no unet/config.json); pass a folder written by "
            "`denoiser train` (run_dir/model) or one under weights/"
        )
    try:
        config = json.loads((folder / "unet" / "config.json").read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"model folder {folder.name!r}: unet/config.json is not valid JSON ({err}); re-export the model") from None
    weights = list((folder / "unet").glob("*.safetensors"))
    if not weights:
        found = ", ".join(sorted(p.name for p in (folder / "unet").iterdir())) or "nothing"
        raise ValueError(
            f"model folder {folder.name!r} has no safetensors weights in unet/ (found: {found[:200]}); "
            "denoiser never unpickles .bin files: re-save with save_pretrained(safe_serialization=True)"
        )
    cls = UNet
    if config.get("_class_name") == "UNet2DModel":
        cls = UNet2DModel  # a diffusers reference model (bench/reference_recipe.py), for evaluation
    try:
        unet = cls.from_pretrained(folder / "unet", use_safetensors=True, torch_dtype=torch.float32)
    except (TypeError, KeyError, OSError, RuntimeError) as err:  # wrong keys, shapes, arguments in config.json
        raise ValueError(f"model folder {folder.name!r} does not load ({type(err).__name__}: {str(err)[:300]})") from None
    scheduler = DDPMScheduler.from_pretrained(folder / "scheduler")
    unet = unet.to(device).eval()
    if channels_last:
        unet = unet.to(memory_format=torch.channels_last)
    return unet, scheduler


def _contained(folder: Path, root: Path) -> bool:
    """Whether `folder` is a model folder directly under `root` whose every file resolves inside it
    (a symlink to a folder or a file elsewhere makes it no model of this root)."""
    resolved = folder.resolve()
    if resolved.parent != root or not (resolved / "unet" / "config.json").is_file():
        return False
    return all(f.resolve().is_relative_to(resolved) for f in resolved.rglob("*"))


def list_models(root: str | Path = WEIGHTS_DIR) -> list[str]:
    """Names of the model folders directly under `root` (the same rule `resolve_model_dir` applies)."""
    root = Path(root).resolve()
    if not root.is_dir():
        return []
    return sorted(p.name for p in root.iterdir() if _contained(p, root))


def resolve_model_dir(name: str, root: str | Path = WEIGHTS_DIR) -> Path:
    """The folder of model `name` under `root`; refuses anything that would leave `root`, symlinks included."""
    root = Path(root).resolve()
    candidate = root / name
    if "/" in name or "\\" in name or name in ("", ".", "..") or not _contained(candidate, root):
        available = ", ".join(list_models(root)) or "none"
        raise ValueError(f"unknown model {name[:80]!r}: choose one of the model folders under weights/ ({available})")
    return candidate.resolve()

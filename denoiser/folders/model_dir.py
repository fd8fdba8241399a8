"""Model folders: loading one (safetensors only, never unpickled) and finding models by
name under the folders of model folders ($DENOISER_WEIGHTS, then a clone's weights/) without ever leaving
them. A model folder is what `denoiser.sampling.pipeline.save_pipeline` writes: `model_index.json`, `unet/`,
`scheduler/` (the sampler it is best sampled with), a text model's `text_encoder/` and `tokenizer/`, plus
`classes.txt` (class names) and `sampling.json` (its measured best guidance and steps), which `read_defaults` reads.

A `LoadedModel` is the one thing `denoiser.sampling.plan.resolve` takes: a UNet, its noise schedule, a `TextModel`
(tokenizer and text encoder, for a text model) and `ModelDefaults`, each read once. `load(folder)` makes one for the CLI
and the app's engine (which caches it); `LoadedModel.of` for the diffusers pipeline (from its components) and for a
model in memory (training's grids and FID).
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
from diffusers import DDPMScheduler, UNet2DModel
from torch import nn

from denoiser.model.text import HashTextEncoder, WordHashTokenizer
from denoiser.model.unet import UNet
from denoiser.request import BUILT_IN, sampler_name

__all__ = [
    "load", "LoadedModel", "TextModel", "ModelDefaults", "read_defaults", "load_model", "find_model", "ModelNotFound", "model_roots",
    "list_models", "WEIGHTS_DIR", "WEIGHTS_ENV", "CLASSES_FILE", "SAMPLING_FILE", "load_text",
    "require_text",
]

CLASSES_FILE = "classes.txt"  # one class name per line, in label order
SAMPLING_FILE = "sampling.json"  # a model folder's measured best: its guidance and step count
SAMPLING_KEYS = {"guidance_scale", "pag_scale", "pag_layers", "guide_model", "guide_scale", "guidance_interval",
                 "num_inference_steps", "note", "example_prompts"}

# diffusers' from_pretrained patches torch for the whole process while it runs (torch.nn.init's functions, and with
# low_cpu_mem_usage accelerate's init_empty_weights, which swaps nn.Module.register_parameter for a meta-device one
# and restores what it found). Two loads in two threads (the app's) then interleave: the later one to leave
# "restores" the earlier one's patch, and every module built afterwards in the process has meta parameters. So one
# load at a time, and none on meta: a module another thread builds meanwhile gets real tensors.
_LOADING = threading.Lock()


WEIGHTS_DIR = Path(__file__).resolve().parents[2] / "weights"  # a clone's shipped models (not in the wheel)
WEIGHTS_ENV = "DENOISER_WEIGHTS"  # folder(s) of model folders, searched by name before WEIGHTS_DIR


def model_roots() -> list[Path]:
    """Where models are found by name: each folder in $DENOISER_WEIGHTS (os.pathsep-separated), then the
    checkout's weights/ when denoiser runs from a clone (an installed wheel has none)."""
    roots = [Path(p).expanduser() for p in os.environ.get(WEIGHTS_ENV, "").split(os.pathsep) if p.strip()]
    if WEIGHTS_DIR.is_dir() and (WEIGHTS_DIR.parent / "pyproject.toml").is_file():
        roots.append(WEIGHTS_DIR)
    return roots


def find_model(name_or_folder: str | Path, roots: str | Path | Sequence[str | Path] | None = None, *,
               paths: bool = True) -> Path:
    """The model folder a person named: a folder of their own (`paths`: the command line's; the app takes names
    only), or a model's name under `roots` (default: `model_roots()`, the first root holding it wins). A name never
    leaves its root, symlinks included (`list_models` offers the same folders). The error says where it looked."""
    path = Path(name_or_folder).expanduser()
    if paths and (path / "unet" / "config.json").is_file():
        return path
    name = str(name_or_folder)
    searched = _roots(roots)
    if not ("/" in name or "\\" in name or name in ("", ".", "..")):
        for root in searched:
            if _contained(root / name, root):
                return (root / name).resolve()
    looked = ", ".join(str(r) for r in searched) or f"nothing (${WEIGHTS_ENV} is not set and this is no checkout)"
    available = ", ".join(list_models(roots)) or "none"
    mend = (f"pass a folder written by `denoiser train` (run_dir/model), or set {WEIGHTS_ENV} to a folder of model "
            "folders" if paths else "choose one of the model folders")
    raise ModelNotFound(f"unknown model {name[:200]!r}: "
                        + ("it is not a model folder (no unet/config.json) and " if paths else "")
                        + f"no model of that name is in {looked} (models there: {available}); {mend}")


class ModelNotFound(FileNotFoundError, ValueError):
    """No model folder of that name: a person's mistake (a ValueError to the app, a missing file to the CLI)."""


@dataclass(frozen=True)
class ModelDefaults:
    """What a model folder says about sampling it; `ModelDefaults()` is a model without a folder."""

    classes: tuple[str, ...] = ()  # class names by label (classes.txt; indices where it has none)
    scheduler: str = BUILT_IN["scheduler"]  # the sampler its scheduler/ config names
    steps: int = BUILT_IN["steps"]  # sampling.json's num_inference_steps, else BUILT_IN
    guidance: dict | None = None  # sampling.json's guidance keys (guidance_scale, pag_scale, ...)
    note: str = ""  # sampling.json's note: how the defaults were measured
    example_prompts: tuple[str, ...] = ()  # sampling.json's: prompts a text model draws (chosen by prompt fidelity)


def read_defaults(folder: str | Path | None, num_classes: int | None) -> ModelDefaults:
    """A model folder's scheduler, step count, guidance and class names (None: no folder, built-in defaults)."""
    if folder is None:
        return ModelDefaults(classes=tuple(str(i) for i in range(num_classes or 0)))
    folder = Path(folder)
    data = _read_json(folder / SAMPLING_FILE) if (folder / SAMPLING_FILE).is_file() else {}
    unknown = sorted(set(data) - SAMPLING_KEYS)
    if unknown:
        raise ValueError(f"{folder / SAMPLING_FILE}: unknown key(s) {', '.join(unknown)}; allowed: {', '.join(sorted(SAMPLING_KEYS))}")
    steps = data.pop("num_inference_steps", BUILT_IN["steps"])
    note = data.pop("note", "")
    examples = data.pop("example_prompts", [])
    if not isinstance(examples, list) or not all(isinstance(p, str) and p.strip() for p in examples):
        raise ValueError(f"{folder / SAMPLING_FILE}: example_prompts must be a list of prompts, got {str(examples)[:80]}")
    config_file = folder / "scheduler" / "scheduler_config.json"
    scheduler_class = _read_json(config_file).get("_class_name", "") if config_file.is_file() else ""
    # a folder saved with the training DDPMScheduler (before folders named their sampler) samples with BUILT_IN's
    scheduler = sampler_name(scheduler_class) if scheduler_class not in ("", "DDPMScheduler") else BUILT_IN["scheduler"]
    return ModelDefaults(_read_classes(folder, num_classes), scheduler, int(steps), data, note, tuple(examples))


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"{path} is not valid JSON ({err}); fix or delete it") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path} must hold a JSON object, got {type(data).__name__}")
    return data


def _read_classes(folder: Path, num_classes: int | None) -> tuple[str, ...]:
    """classes.txt's names by label; indices as names where it has none (or the wrong number)."""
    n = num_classes or 0
    path = folder / CLASSES_FILE
    names = [c.strip() for c in path.read_text().split("\n") if c.strip()] if path.is_file() else []
    return tuple(names) if len(names) == n else tuple(str(i) for i in range(n))


@dataclass(frozen=True)
class TextModel:
    """A text model's prompt reader: its tokenizer (words to hashed n-gram ids) and its text encoder."""

    tokenizer: WordHashTokenizer
    encoder: HashTextEncoder


@dataclass
class LoadedModel:
    """A model loaded once: the one thing sampling and restoring run with (`denoiser.sampling.plan.resolve`), from a
    folder (`load`), a diffusers pipeline's components (DenoiserPipeline) or a model in memory (`LoadedModel.of`)."""

    unet: nn.Module
    noise_schedule: DDPMScheduler  # the model's training noise schedule (betas, ᾱ_t): restoring and statistics use it
    text: TextModel | None = None  # a text model's tokenizer and encoder; None: a class or unconditional model
    defaults: ModelDefaults = field(default_factory=ModelDefaults)  # what the folder says about sampling it
    folder: Path | None = None  # None: a model built in memory
    # the sampler (a diffusers scheduler) a request that names none samples with, as it is (a pipeline's own, which
    # its user may swap); None: the folder's sampler (defaults.scheduler) on `noise_schedule`
    sampler: object | None = None

    @classmethod
    def of(cls, unet: nn.Module, scheduler, text: TextModel | None = None, folder: str | Path | None = None,
           classes: Sequence[str] | None = None) -> LoadedModel:
        """A model in memory (or a pipeline's components): `scheduler` is its noise schedule and samples unless a
        request names another sampler; the
        defaults are `folder`'s (read once), else built in; `classes` names the class labels instead."""
        folder = None if folder is None else Path(folder)
        defaults = read_defaults(folder, unet.config.num_class_embeds)
        if classes is not None:
            defaults = dataclasses.replace(defaults, classes=tuple(str(c) for c in classes))
        return cls(unet, scheduler, text, defaults, folder, sampler=scheduler)


def load(model_dir: str | Path, device: str | torch.device = "cpu", channels_last: bool = True) -> LoadedModel:
    """A model folder's UNet and training scheduler (`load_model`), its text model (`load_text`) and its sampling
    defaults (`read_defaults`), each read once, checked before any work."""
    folder = Path(model_dir)
    unet, noise_schedule = load_model(folder, device, channels_last)
    text = load_text(folder, device)
    if text is None and getattr(unet.config, "cross_attention_dim", None) is not None:
        require_text(folder, device)  # a UNet with cross-attention cannot run without its text encoder: say so now
    return LoadedModel(unet, noise_schedule, text, read_defaults(folder, unet.config.num_class_embeds), folder)


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
        cls = UNet2DModel  # a diffusers reference model (bench/recipe_comparison.md), for evaluation
    try:
        with _LOADING:
            # no torch_dtype: diffusers loads into float32 (torch's default), and the precision stays ours to choose
            unet = cls.from_pretrained(folder / "unet", use_safetensors=True, low_cpu_mem_usage=False).float()
    except (TypeError, KeyError, OSError, RuntimeError) as err:  # wrong keys, shapes, arguments in config.json
        raise ValueError(f"model folder {folder.name!r} does not load ({type(err).__name__}: {str(err)[:300]})") from None
    # the training scheduler (the noise schedule), whichever sampler the folder's scheduler/ names
    scheduler = DDPMScheduler.from_config(_known_keys(DDPMScheduler, DDPMScheduler.load_config(folder / "scheduler")))
    unet = unet.to(device).eval()
    if channels_last:
        unet = unet.to(memory_format=torch.channels_last)
    return unet, scheduler


def load_text(model_dir: str | Path, device: str | torch.device = "cpu") -> TextModel | None:
    """A text model folder's tokenizer and text encoder (fp32, eval mode); None for a folder without text_encoder/."""
    folder = Path(model_dir)
    if not (folder / "text_encoder" / "config.json").is_file():
        return None
    if not (folder / "tokenizer" / WordHashTokenizer.config_name).is_file():
        raise ValueError(f"model folder {folder.name!r} has a text_encoder/ but no tokenizer/{WordHashTokenizer.config_name}; "
                         "re-export the model (save_pipeline with its tokenizer)")
    try:
        with _LOADING:
            encoder = HashTextEncoder.from_pretrained(folder / "text_encoder", use_safetensors=True,
                                                      torch_dtype=torch.float32, low_cpu_mem_usage=False)
    except (TypeError, KeyError, OSError, RuntimeError) as err:
        raise ValueError(f"model folder {folder.name!r}: text_encoder/ does not load ({type(err).__name__}: {str(err)[:300]})") from None
    return TextModel(WordHashTokenizer.from_pretrained(folder / "tokenizer"), encoder.to(device).eval())


def require_text(model_dir: str | Path | None, device: str | torch.device = "cpu") -> TextModel:
    """load_text for a UNet with cross-attention, which cannot run without its text encoder: a clear error where the
    folder (or, None, the caller) gives none."""
    text = load_text(model_dir, device) if model_dir is not None else None
    if text is None:
        where = f"model folder {Path(model_dir).name!r}: " if model_dir is not None else ""
        raise ValueError(f"{where}this UNet has cross-attention but no text encoder was found: load it from its model "
                         "folder (text_encoder/, tokenizer/)")
    return text


def _known_keys(cls, config: dict) -> dict:
    """The keys of a scheduler config that `cls` takes (a DDIM config holds set_alpha_to_one, which DDPM lacks)."""
    return {k: v for k, v in config.items() if k in inspect.signature(cls.__init__).parameters}


def _contained(folder: Path, root: Path) -> bool:
    """Whether `folder` is a model folder directly under `root` whose every file resolves inside it
    (a symlink to a folder or a file elsewhere makes it no model of this root)."""
    resolved = folder.resolve()
    if resolved.parent != root or not (resolved / "unet" / "config.json").is_file():
        return False
    return all(f.resolve().is_relative_to(resolved) for f in resolved.rglob("*"))


def _roots(roots: str | Path | Sequence[str | Path] | None) -> list[Path]:
    if roots is None:
        roots = model_roots()
    elif isinstance(roots, (str, Path)):
        roots = [roots]
    return [Path(r).resolve() for r in roots]


def list_models(roots: str | Path | Sequence[str | Path] | None = None) -> list[str]:
    """Names of the model folders directly under `roots` (default: `model_roots()`; the first root holding a
    name wins, the same rule `find_model` applies)."""
    names: set[str] = set()
    for root in _roots(roots):
        if root.is_dir():
            names.update(p.name for p in root.iterdir() if _contained(p, root))
    return sorted(names)

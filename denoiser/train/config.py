"""Typed run configs: YAML sections mapped onto dataclasses, with every mistake reported up front.

A config file has the sections `model:` (exactly the `UNet` constructor arguments), `data:`,
`diffusion:`, `train:` and, for a text model (`model.cross_attention_dim`), `text:`. Unknown keys and wrong types are errors, never silently ignored.
`--set key=value` overrides use dotted (`train.lr=2e-4`) or bare (`lr=2e-4`) keys.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import inspect
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from denoiser.data.config import DataConfig
from denoiser.diffusion import DiffusionConfig
from denoiser.request import BUILT_IN

__all__ = ["DataConfig", "DiffusionConfig", "TrainConfig", "RunConfig", "load_config", "apply_overrides"]


@dataclass
class TrainConfig:
    seed: int = 0  # seeds model init, data order, noise and dropout
    batch_size: int = 64  # global batch per optimizer step, split over processes and accumulation steps
    max_steps: int = 10000  # optimizer steps (the LR schedule's length)
    time_limit_minutes: float | None = None  # stop, checkpoint and export after this much wall-clock (this sitting)
    lr: float = 2e-4  # peak AdamW learning rate
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    weight_decay: float = 0.0
    lr_scheduler: str = "cosine"  # any diffusers get_scheduler name: "cosine", "constant_with_warmup", ...
    lr_warmup_steps: int = 500  # in optimizer steps
    gradient_accumulation_steps: int = 1
    max_grad_norm: float | None = 1.0  # clip the global grad norm; None disables
    mixed_precision: str = "no"  # "no", "bf16" or "fp16" (through Accelerate autocast)
    ema: bool = True  # keep an EMA of the weights (diffusers EMAModel); exported instead of the raw weights
    ema_max_decay: float = 0.9999  # EMA decay ceiling
    ema_power: float = 0.75  # EMA warmup: decay = 1 - (1 + step / inv_gamma) ** -power
    ema_inv_gamma: float = 1.0
    # further EMA lengths tracked beside the run's EMA, each exported as model-ema-<name>/ to pick the length by FID
    # after the run (denoiser/train/ema.py): other ceilings with ema_power's warm-up (long runs: the ceiling binds after
    # ~(1 - decay) ** (-1 / power) steps, 25k for 0.9995 at 0.75), and other warm-up powers under ema_max_decay
    # (short runs: at step k the decay is 1 - k ** -power, an average over ~k ** power steps)
    ema_extra_decays: list[float] = field(default_factory=list)
    ema_extra_powers: list[float] = field(default_factory=list)
    snr_gamma: float | None = None  # min-SNR-γ loss weighting (Hang et al. 2023); None = plain MSE
    class_dropout: float = 0.1  # drop labels to "no class" with this probability (class-conditional models)
    caption_dropout: float = 0.1  # replace captions by "" (no condition) with this probability (data.caption_columns; applied where the data picks them)
    checkpoint_every: int = 1000  # steps between checkpoints (accelerate save_state)
    keep_checkpoints: int = 2  # newest checkpoints kept; older ones are deleted
    sample_every: int = 1000  # steps between sample-grid and loss-curve PNGs; 0 disables
    num_sample_images: int = 16  # images in each sample grid
    sample_steps: int = BUILT_IN["steps"]  # the built-in sampler's steps for sample grids and FID
    # steps between reads of the loss on the host: loss.csv rows, the finite check, progress, tracker logs and the
    # processes' agreement to stop (signal, time limit). Between reads a step never waits for the device, so a
    # non-finite loss stops the run at most log_every steps late (never saving that state)
    log_every: int = 10
    report_to: str | None = "tensorboard"  # Accelerate trackers (log_with): "tensorboard", "wandb", "mlflow", "all", ...; null = none
    fid_every: int = 0  # steps between FID evaluations of the EMA weights (0 = off); logged to fid.csv and tensorboard
    fid_samples: int = 1000  # generated images per FID evaluation (DDIM, sample_steps, classes spread): FID-N
    fid_reference: str | None = None  # reference statistics file; when missing, computed from the validation split
    keep_best: bool = False  # with fid_every: also export the best-FID weights to run_dir/best-model
    # channels-last memory format: faster convolutions. None = on, except for CPU training where
    # denoiser's NHWC GroupNorm kernel does not apply (fp16, or no C++ compiler with bf16): torch's own
    # NHWC GroupNorm is several times slower there.
    channels_last: bool | None = None
    compile: bool = False  # torch.compile the UNet (optional; bench/compile_and_memory.md says where it pays)
    compile_mode: str | None = None  # torch.compile mode with compile: null (default), "reduce-overhead" (CUDA graphs), "max-autotune"
    # the training split resident on the device, noise drawn there (same seeds, ids, flips, captions as on the host);
    # None = on for a GPU with the prepared store, off elsewhere (on a CPU the device is the host: the same path)
    device_data: bool | None = None
    gradient_checkpointing: bool = False  # recompute each block in the backward pass: less memory, ~1/3 more time


@dataclass
class TextConfig:
    """The tokenizer and text encoder of a text model (denoiser/model/text.py); used when model.cross_attention_dim is set,
    which must equal hidden_size. Their arguments are written into the model folder (tokenizer/, text_encoder/)."""

    num_buckets: int = 16384  # hashed n-gram buckets (the embedding table's rows)
    min_n: int = 2  # shortest character n-gram of a word
    max_n: int = 4  # longest character n-gram of a word
    max_ngrams: int = 24  # n-grams per word, the word itself included
    max_length: int = 32  # words per prompt; later words are dropped (with a warning where prompts are typed)
    hidden_size: int = 256  # token vector width = model.cross_attention_dim
    num_layers: int = 2  # transformer layers over the words
    num_heads: int = 4

    def tokenizer_args(self) -> dict[str, int]:
        return {k: getattr(self, k) for k in ("num_buckets", "min_n", "max_n", "max_length", "max_ngrams")}

    def encoder_args(self) -> dict[str, int]:
        return {k: getattr(self, k) for k in ("num_buckets", "hidden_size", "num_layers", "num_heads", "max_length")}


SECTIONS = {"data": DataConfig, "diffusion": DiffusionConfig, "train": TrainConfig, "text": TextConfig}


@dataclass
class RunConfig:
    model: dict[str, Any] = field(default_factory=dict)  # the UNet's constructor arguments
    data: DataConfig = field(default_factory=DataConfig)
    diffusion: DiffusionConfig = field(default_factory=DiffusionConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    text: TextConfig = field(default_factory=TextConfig)

    @property
    def prompted(self) -> bool:
        """A text model: the UNet has cross-attention, fed by the text encoder from the data's captions."""
        return self.model.get("cross_attention_dim") is not None

    def to_dict(self) -> dict[str, Any]:
        return {"model": dict(self.model), **{k: dataclasses.asdict(getattr(self, k)) for k in SECTIONS}}


def _type_ok(value: Any, annotation: Any) -> bool:
    """Whether a YAML value fits a field annotation (int passes for float; None only if Optional)."""
    if annotation is Any:
        return True
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        return any(_type_ok(value, a) for a in typing.get_args(annotation))
    if annotation is type(None):
        return value is None
    if annotation is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if annotation is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if origin in (list, tuple, collections.abc.Sequence) or annotation in (list, tuple):
        return isinstance(value, (list, tuple))
    if origin is dict:
        return isinstance(value, dict)
    return isinstance(value, annotation)


def _coerce(value: Any, annotation: Any) -> Any:
    """YAML 1.1 reads `1e-4` (no dot) as a string; accept it where a float is expected. It also reads a bare
    `no`/`off` as False and `yes`/`on` as True: where a string is expected (mixed_precision: no), give the word back."""
    if isinstance(value, bool) and annotation is str:
        return "no" if value is False else "yes"
    if isinstance(value, str) and _type_ok(1.5, annotation) and not _type_ok(value, annotation):
        try:
            return float(value)
        except ValueError:
            return value
    return value


def _type_name(annotation: Any) -> str:
    return getattr(annotation, "__name__", None) or str(annotation).replace("typing.", "")


def _model_signature() -> dict[str, Any]:
    from denoiser.model.unet import UNet

    hints = typing.get_type_hints(UNet.__init__)  # resolves the string annotations
    return {k: hints.get(k, Any) for k in inspect.signature(UNet.__init__).parameters if k != "self"}


def _build(raw: dict[str, Any], source: str) -> RunConfig:
    if not isinstance(raw, dict):
        raise ValueError(f"{source}: a config must be a mapping with sections model/data/diffusion/train")
    unknown = set(raw) - {"model", *SECTIONS}
    if unknown:
        raise ValueError(f"{source}: unknown section(s) {sorted(unknown)}; allowed: model, data, diffusion, train, text")
    errors = []
    model = raw.get("model") or {}
    params = _model_signature()
    for key, value in list(model.items()):
        if key in params:
            value = model[key] = _coerce(value, params[key])
        if key not in params:
            errors.append(f"model.{key} is not a UNet argument (allowed: {', '.join(params)})")
        elif not _type_ok(value, params[key]):
            errors.append(f"model.{key} should be {_type_name(params[key])}, got {value!r}")
    sections = {}
    for name, cls in SECTIONS.items():
        values = raw.get(name) or {}
        if not isinstance(values, dict):
            errors.append(f"section {name}: must be a mapping, got {values!r}")
            continue
        hints = typing.get_type_hints(cls)
        values = {k: _coerce(v, hints[k]) if k in hints else v for k, v in values.items()}
        for key, value in values.items():
            if key not in hints:
                errors.append(f"{name}.{key} is unknown (allowed: {', '.join(hints)})")
            elif not _type_ok(value, hints[key]):
                errors.append(f"{name}.{key} should be {_type_name(hints[key])}, got {value!r}")
        if not errors:
            sections[name] = cls(**values)
    if errors:
        raise ValueError(f"{source}: invalid config:\n  " + "\n  ".join(errors))
    cfg = RunConfig(model=dict(model), **sections)
    _check_values(cfg, source)
    return cfg


def _check_values(cfg: RunConfig, source: str) -> None:
    t, d, diff = cfg.train, cfg.data, cfg.diffusion
    checks = [
        (t.batch_size >= 1, f"train.batch_size must be at least 1, got {t.batch_size}"),
        (t.max_steps >= 1, f"train.max_steps must be at least 1, got {t.max_steps}"),
        (t.time_limit_minutes is None or t.time_limit_minutes > 0, f"train.time_limit_minutes must be positive, got {t.time_limit_minutes}"),
        (t.lr > 0, f"train.lr must be positive, got {t.lr}"),
        (t.gradient_accumulation_steps >= 1, f"train.gradient_accumulation_steps must be >= 1, got {t.gradient_accumulation_steps}"),
        (t.mixed_precision in ("no", "bf16", "fp16"), f"train.mixed_precision must be no, bf16 or fp16, got {t.mixed_precision!r}"),
        (t.checkpoint_every >= 1, f"train.checkpoint_every must be >= 1, got {t.checkpoint_every}"),
        (t.keep_checkpoints >= 1, f"train.keep_checkpoints must be >= 1, got {t.keep_checkpoints}"),
        (0 <= t.class_dropout < 1, f"train.class_dropout must be in [0, 1), got {t.class_dropout}"),
        (0 <= t.caption_dropout < 1, f"train.caption_dropout must be in [0, 1), got {t.caption_dropout}"),
        (t.log_every >= 1, f"train.log_every must be >= 1, got {t.log_every}"),
        (all(isinstance(d, (int, float)) and 0 < d < 1 for d in t.ema_extra_decays), f"train.ema_extra_decays must be decays in (0, 1), got {t.ema_extra_decays}"),
        (all(isinstance(p, (int, float)) and p > 0 for p in t.ema_extra_powers), f"train.ema_extra_powers must be positive, got {t.ema_extra_powers}"),
        (t.compile_mode in (None, "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"),
         f"train.compile_mode must be null, default, reduce-overhead, max-autotune or max-autotune-no-cudagraphs, got {t.compile_mode!r}"),
        (t.fid_every >= 0, f"train.fid_every must be >= 0 (0 = off), got {t.fid_every}"),
        (t.fid_samples >= 2, f"train.fid_samples must be at least 2, got {t.fid_samples}"),
        (not t.keep_best or t.fid_every > 0, "train.keep_best needs train.fid_every > 0 (best by FID)"),
        (not t.fid_every or t.fid_reference or d.val_size >= 2,
         "train.fid_every needs train.fid_reference or a validation split (data.val_size >= 2) to compute it from"),
        (d.num_workers is None or d.num_workers >= 1, f"data.num_workers must be >= 1 (or null: every core), got {d.num_workers}"),
        (d.shuffle_buffer >= 1, f"data.shuffle_buffer must be >= 1 (1: shard order only), got {d.shuffle_buffer}"),
        (d.val_size >= 0, f"data.val_size must be >= 0, got {d.val_size}"),
        (all(isinstance(c, str) and c for c in d.caption_columns) and len(set(d.caption_columns)) == len(d.caption_columns),
         f"data.caption_columns must be distinct column names, got {d.caption_columns!r}"),
        (d.caption_separator is None or d.caption_separator != "",
         'data.caption_separator must be a non-empty string such as "|", or null for none'),
        (diff.beta_schedule in ("linear", "cosine"), f"diffusion.beta_schedule must be linear or cosine, got {diff.beta_schedule!r}"),
        (diff.prediction_type in ("epsilon", "v_prediction"), f"diffusion.prediction_type must be epsilon or v_prediction, got {diff.prediction_type!r}"),
    ]
    errors = [msg for ok, msg in checks if not ok] + _data_source_errors(d) + _text_errors(cfg)
    if errors:
        raise ValueError(f"{source}: invalid config:\n  " + "\n  ".join(errors))
    # The UNet checks its own arguments (divisibility of sample_size, groups, ...); build it on meta.
    import torch

    from denoiser.model.unet import UNet

    try:
        with torch.device("meta"):
            UNet(**cfg.model)
    except (TypeError, ValueError) as err:
        raise ValueError(f"{source}: invalid model section: {err}") from None


def _text_errors(cfg: RunConfig) -> list[str]:
    """A text model needs captions and a text encoder as wide as its cross-attention."""
    x, D = cfg.text, cfg.model.get("cross_attention_dim")
    if D is None:
        return []
    errors = []
    if D != x.hidden_size:
        errors.append(f"model.cross_attention_dim ({D}) must equal text.hidden_size ({x.hidden_size}), the width of "
                      "the text encoder's token vectors: set both to the same value")
    if not cfg.data.caption_columns:
        errors.append("model.cross_attention_dim makes a text model, which learns from captions: set data.caption_columns "
                      "(e.g. [name, keywords] of a folder's metadata.csv), or remove model.cross_attention_dim")
    if x.num_buckets < 2 or not 1 <= x.min_n <= x.max_n or x.max_length < 1 or x.max_ngrams < 1 or x.num_layers < 0:
        errors.append("text: need num_buckets >= 2, 1 <= min_n <= max_n, max_length >= 1, max_ngrams >= 1, num_layers >= 0")
    if x.num_heads < 1 or x.hidden_size % x.num_heads:
        errors.append(f"text.hidden_size ({x.hidden_size}) must be divisible by text.num_heads ({x.num_heads})")
    return errors


def _data_source_errors(d: DataConfig) -> list[str]:
    """What is wrong with `data.dataset` and `data.path`, by the table of sources (denoiser/data/sources.py)."""
    from denoiser.data.sources import SOURCES, streamable  # the data package imports torch: only when checking

    kind = SOURCES.get(d.dataset)
    if kind is None:
        return [f"data.dataset must be one of {', '.join(SOURCES)}, got {d.dataset!r}"]
    errors = []
    if kind.needs_path and not d.path:
        errors.append(f"data.path is required for dataset {d.dataset!r}: set data.path to the image folder")
    if d.streaming and kind.open_shards is None:
        errors.append(f"data.streaming needs sharded data (data.dataset: {' or '.join(streamable())}), got {d.dataset!r}; "
                      "remove data.streaming to prepare it into the store, or write it as WebDataset shards")
    if d.caption_columns and not kind.text:
        errors.append(f"data.caption_columns: dataset {d.dataset!r} carries no text; use a folder with a metadata.csv, "
                      f"an hf dataset or WebDataset shards, or set data.caption_columns: []")
    if kind.local_path and d.path and not Path(d.path).expanduser().exists():
        errors.append(f"data.path {d.path!r} does not exist: point it at an image folder (class sub-folders)")
    return errors


def apply_overrides(raw: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply `key=value` strings (values parsed as YAML) to a raw config dict, in place."""
    for item in overrides:
        if "=" not in item:
            raise ValueError(f"--set expects key=value, got {item!r} (e.g. --set train.lr=1e-4)")
        key, value = item.split("=", 1)
        value = yaml.safe_load(value)
        if "." in key:
            section, name = key.split(".", 1)
        else:
            owners = [s for s, cls in SECTIONS.items() if name_in(cls, key)] + (["model"] if key in _model_signature() else [])
            if "text" in owners and len(owners) > 1:  # num_heads, ...: bare keys keep meaning what they meant before text
                owners.remove("text")
            if len(owners) != 1:
                where = "no section" if not owners else f"several sections ({', '.join(owners)})"
                raise ValueError(f"--set {key}: found in {where}; write it as section.{key}")
            section, name = owners[0], key
        if section not in ("model", *SECTIONS):
            raise ValueError(f"--set {key}: unknown section {section!r} (model, data, diffusion, train, text)")
        raw.setdefault(section, {})
        if raw[section] is None:
            raw[section] = {}
        raw[section][name] = value
    return raw


def name_in(cls, key: str) -> bool:
    return key in {f.name for f in dataclasses.fields(cls)}


PRESETS_DIR = Path(__file__).resolve().parents[1] / "presets"  # configs/*.yaml, shipped in the package (a link in a clone)


def presets() -> list[str]:
    """Names of the shipped training presets (`denoiser train --config NAME`)."""
    return sorted(p.stem for p in PRESETS_DIR.glob("*.yaml"))


def find_config(name_or_path: str | Path) -> Path:
    """A YAML file given by path, or a preset by name ("cifar10" or "cifar10.yaml")."""
    path = Path(name_or_path)
    if path.is_file():
        return path
    preset = PRESETS_DIR / f"{path.stem}.yaml"
    if path.parent == Path(".") and path.suffix in ("", ".yaml") and preset.is_file():
        return preset
    raise FileNotFoundError(
        f"config {str(name_or_path)!r} is neither a file nor a preset; presets: {', '.join(presets())}"
    )


def load_config(path: str | Path | None, overrides: list[str] | None = None) -> RunConfig:
    """Read a YAML config, a file or a preset name (or the defaults when `path` is None), apply overrides,
    validate."""
    raw: dict[str, Any] = {}
    source = "defaults"
    if path is not None:
        path = find_config(path)
        raw = yaml.safe_load(path.read_text()) or {}
        source = str(path)
    apply_overrides(raw, overrides or [])
    return _build(raw, source)


def config_from_dict(raw: dict[str, Any], source: str = "config") -> RunConfig:
    return _build(raw, source)

"""The model as a diffusers pipeline: `DenoiserPipeline`, and model folders written atomically and read
with safetensors only.

A model folder is what `DenoiserPipeline.save_pretrained` writes (`model_index.json`, `unet/`,
`scheduler/`) plus `classes.txt` (class names) and `sampling.json` (measured default guidance), so
`DiffusionPipeline.from_pretrained(folder)` returns a `DenoiserPipeline` after `import denoiser`, and
diffusers' own `DDPMPipeline`/`DDIMPipeline` still load it (without classes or guidance).
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path

import diffusers
import torch
from diffusers import DDPMScheduler, DiffusionPipeline, ImagePipelineOutput, UNet2DModel
from diffusers.schedulers.scheduling_utils import SchedulerMixin

from denoiser.guidance import guidance_for, read_sampling_defaults
from denoiser.sample import sample
from denoiser.unet import UNet

__all__ = [
    "DenoiserPipeline", "save_pipeline", "load_model", "read_classes", "find_model", "model_roots", "resolve_model_dir",
    "list_models", "WEIGHTS_DIR", "WEIGHTS_ENV", "CLASSES_FILE",
]

CLASSES_FILE = "classes.txt"  # one class name per line, in label order


class DenoiserPipeline(DiffusionPipeline):
    """Class-conditional, guided sampling of a denoiser UNet in diffusers' pipeline shape.

        pipe = DiffusionPipeline.from_pretrained("weights/cifar10")   # after `import denoiser`
        images = pipe(4, class_labels="cat", guidance_scale=2.0, generator=torch.Generator().manual_seed(0)).images

    The loop is denoiser's `sample()`, so a seed gives the images `denoiser sample` gives with the same
    scheduler and settings. Any diffusers scheduler built from the training one may be swapped in
    (`pipe.scheduler = DDIMScheduler.from_config(pipe.scheduler.config)`). Guidance arguments left out
    come from the folder's sampling.json (`pipe.sampling_defaults`), class names from its classes.txt
    (`pipe.classes`).
    """

    model_cpu_offload_seq = "unet"
    _callback_tensor_inputs = ["latents"]

    def __init__(self, unet: UNet, scheduler: SchedulerMixin):
        super().__init__()
        self.register_modules(unet=unet, scheduler=scheduler)
        self._classes: list[str] | None = None
        self._guides: dict[str, tuple] = {}

    @property
    def folder(self) -> Path | None:
        """The local folder this pipeline was loaded from (None: built in memory or from the Hub)."""
        name = self.name_or_path
        return Path(name) if name and Path(name).is_dir() else None

    @property
    def classes(self) -> list[str]:
        """Class names by label (classes.txt; indices where the folder has none); [] for an unconditional model."""
        if self._classes is None:
            self._classes = read_classes(self.folder, self.unet.config.num_class_embeds)
        return self._classes

    @classes.setter
    def classes(self, names: Sequence[str]) -> None:
        n = self.unet.config.num_class_embeds or 0
        if len(names) != n:
            raise ValueError(f"this model has {n} classes, got {len(names)} names")
        self._classes = [str(c) for c in names]

    @property
    def sampling_defaults(self) -> dict:
        """The folder's sampling.json: the guidance a call without guidance arguments uses."""
        return read_sampling_defaults(self.folder) if self.folder is not None else {}

    def labels(self, class_labels: int | str | Sequence[int | str] | None, batch_size: int) -> list[int] | None:
        """Class labels (ints, class names or a mix; one for all images or one per image) -> label ints."""
        if class_labels is None:
            return None
        given = [class_labels] if isinstance(class_labels, (int, str)) else list(class_labels)
        if len(given) not in (1, batch_size):
            raise ValueError(f"pass one class label or one per image ({batch_size}), got {len(given)}")
        out = []
        for c in given:
            if isinstance(c, str) and not c.isdigit():
                if c not in self.classes:
                    raise ValueError(f"unknown class {c!r}; this model's classes: {', '.join(self.classes)}")
                c = self.classes.index(c)
            out.append(int(c))  # the UNet checks the range
        return out * batch_size if len(out) == 1 else out

    @torch.no_grad()
    def __call__(
        self,
        batch_size: int = 1,
        class_labels: int | str | Sequence[int | str] | None = None,
        guidance_scale: float | None = None,
        pag_scale: float | None = None,
        pag_layers: str | Sequence[str] | None = None,
        guide_model: str | Path | None = None,
        guide_scale: float | None = None,
        num_inference_steps: int = 50,
        generator: torch.Generator | list[torch.Generator] | None = None,
        eta: float = 0.0,
        output_type: str = "pil",
        return_dict: bool = True,
        callback_on_step_end: Callable[[DiffusionPipeline, int, int, dict], dict] | None = None,
        callback_on_step_end_tensor_inputs: Sequence[str] = ("latents",),
    ) -> ImagePipelineOutput | tuple:
        """Generate `batch_size` images.

        class_labels: an int, a class name (`pipe.classes`) or one per image; None samples the "no class" row.
        guidance_scale (classifier-free, needs a class), pag_scale/pag_layers (perturbed-attention),
        guide_model/guide_scale (autoguidance, a folder): denoiser.guidance; None takes sampling.json's value.
        output_type: "pil" (list of PIL images), "np" ((B, H, W, C) floats in [0, 1]) or "pt" ((B, C, H, W)).
        callback_on_step_end(pipe, i, t, {"latents": x}) runs after every step and may return new latents.
        """
        if output_type not in ("pil", "np", "pt"):
            raise ValueError(f"output_type must be 'pil', 'np' or 'pt', got {output_type!r}")
        unknown = set(callback_on_step_end_tensor_inputs) - set(self._callback_tensor_inputs)
        if unknown:
            raise ValueError(f"callback_on_step_end_tensor_inputs: only {self._callback_tensor_inputs} exist, got {sorted(unknown)}")
        labels = self.labels(class_labels, batch_size)
        guidance = guidance_for(
            self.folder, self.unet, self.scheduler.config, guidance_scale, pag_scale, pag_layers, guide_model, guide_scale,
            load_guide=self._load_guide, has_class=labels is not None,
        )
        def after_step(i: int, x: torch.Tensor) -> torch.Tensor:
            if callback_on_step_end is not None:  # sample() has set the scheduler's timesteps by now
                x = callback_on_step_end(self, i, self.scheduler.timesteps[i], {"latents": x}).get("latents", x)
            bar.update()
            return x

        with self.progress_bar(total=num_inference_steps) as bar:
            images = sample(
                self.unet, self.scheduler, num_images=batch_size, num_inference_steps=num_inference_steps, eta=eta,
                class_labels=labels, guidance=guidance, after_step=after_step, generator=generator,
            ).images  # (B, C, H, W) in [0, 1]
        self.maybe_free_model_hooks()
        if output_type != "pt":
            images = images.permute(0, 2, 3, 1).numpy()  # (B, H, W, C)
            if output_type == "pil":
                images = self.numpy_to_pil(images)
        return ImagePipelineOutput(images=images) if return_dict else (images,)

    def _load_guide(self, folder: Path) -> tuple:
        key = str(Path(folder).resolve())
        if key not in self._guides:
            self._guides[key] = load_model(folder, device=self.unet.device, channels_last=False)
        return self._guides[key]

    def save_pretrained(self, save_directory: str | Path, **kwargs) -> None:
        """diffusers' save_pretrained, plus classes.txt when the classes have names."""
        super().save_pretrained(save_directory, **kwargs)
        n = self.unet.config.num_class_embeds or 0
        if self.classes != [str(i) for i in range(n)]:
            (Path(save_directory) / CLASSES_FILE).write_text("\n".join(self.classes) + "\n")


# `DiffusionPipeline.from_pretrained` finds a folder's pipeline class by its name in the diffusers module
setattr(diffusers, DenoiserPipeline.__name__, DenoiserPipeline)


def read_classes(folder: str | Path | None, num_classes: int | None) -> list[str]:
    """Class names of a model from its folder's classes.txt; indices as names where it has none (or the
    wrong number)."""
    n = num_classes or 0
    path = Path(folder) / CLASSES_FILE if folder is not None else None
    names = path.read_text().split("\n") if path is not None and path.is_file() else []
    names = [c.strip() for c in names if c.strip()]
    return names if len(names) == n else [str(i) for i in range(n)]

WEIGHTS_DIR = Path(__file__).resolve().parent.parent / "weights"  # a clone's shipped models (not in the wheel)
WEIGHTS_ENV = "DENOISER_WEIGHTS"  # folder(s) of model folders, searched by name before WEIGHTS_DIR


def model_roots() -> list[Path]:
    """Where models are found by name: each folder in $DENOISER_WEIGHTS (os.pathsep-separated), then the
    checkout's weights/ when denoiser runs from a clone (an installed wheel has none)."""
    roots = [Path(p).expanduser() for p in os.environ.get(WEIGHTS_ENV, "").split(os.pathsep) if p.strip()]
    if WEIGHTS_DIR.is_dir() and (WEIGHTS_DIR.parent / "pyproject.toml").is_file():
        roots.append(WEIGHTS_DIR)
    return roots


def find_model(name_or_folder: str | Path) -> Path:
    """A model folder given by path, or by name under `model_roots()`; the error says where it looked."""
    path = Path(name_or_folder).expanduser()
    if (path / "unet" / "config.json").is_file():
        return path
    name = str(name_or_folder)
    roots = model_roots()
    if "/" not in name and "\\" not in name:
        for root in roots:
            if (root / name / "unet" / "config.json").is_file():
                return root / name
    looked = ", ".join(str(r) for r in roots) or f"nothing (${WEIGHTS_ENV} is not set and this is no checkout)"
    raise FileNotFoundError(
        f"no model {name[:200]!r}: it is not a model folder (no unet/config.json) and no model of that name is in: "
        f"{looked}. Pass a folder written by `denoiser train` (run_dir/model), or set {WEIGHTS_ENV} to a folder of "
        "model folders"
    )


def save_pipeline(
    unet: UNet, scheduler: DDPMScheduler, out_dir: str | Path, dtype: torch.dtype | None = None,
    classes: Sequence[str] | None = None,
) -> Path:
    """Write a DenoiserPipeline folder to a temporary sibling, then swap it into place.

    An existing folder is only replaced once the new one is complete; `dtype` (e.g. torch.float16)
    shrinks the shipped weights, and `load_model` upcasts them again; `classes` names the class labels.
    """
    out = Path(out_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp-{uuid.uuid4().hex[:8]}")
    # safetensors stores contiguous tensors: undo channels-last (on a copy) before saving
    unet = copy.deepcopy(unet).to(memory_format=torch.contiguous_format)
    if dtype is not None:
        unet = unet.to(dtype=dtype)
    pipe = DenoiserPipeline(unet=unet, scheduler=scheduler)
    if classes is not None:
        pipe.classes = classes
    pipe.save_pretrained(tmp, safe_serialization=True)
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


def _roots(roots: str | Path | Sequence[str | Path] | None) -> list[Path]:
    if roots is None:
        roots = model_roots()
    elif isinstance(roots, (str, Path)):
        roots = [roots]
    return [Path(r).resolve() for r in roots]


def list_models(roots: str | Path | Sequence[str | Path] | None = None) -> list[str]:
    """Names of the model folders directly under `roots` (default: `model_roots()`; the first root holding a
    name wins, the same rule `resolve_model_dir` applies)."""
    names: set[str] = set()
    for root in _roots(roots):
        if root.is_dir():
            names.update(p.name for p in root.iterdir() if _contained(p, root))
    return sorted(names)


def resolve_model_dir(name: str, roots: str | Path | Sequence[str | Path] | None = None) -> Path:
    """The folder of model `name` under the first of `roots` that has it; refuses anything that would leave
    its root, symlinks included."""
    for root in _roots(roots):
        candidate = root / name
        if not ("/" in name or "\\" in name or name in ("", ".", "..")) and _contained(candidate, root):
            return candidate.resolve()
    available = ", ".join(list_models(roots)) or "none"
    raise ValueError(f"unknown model {name[:80]!r}: choose one of the model folders ({available})")

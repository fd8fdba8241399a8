"""The model as a diffusers pipeline: `DenoiserPipeline`, and model folders written atomically
(`save_pipeline`); reading and finding them is denoiser/model_dir.py.

A model folder is what `DenoiserPipeline.save_pretrained` writes (`model_index.json`, `unet/`,
`scheduler/`) plus `classes.txt` (class names) and `sampling.json` (measured default guidance), so
`DiffusionPipeline.from_pretrained(folder)` returns a `DenoiserPipeline` after `import denoiser`, and
diffusers' own `DDPMPipeline`/`DDIMPipeline` still load it (without classes or guidance).
"""

from __future__ import annotations

import copy
import shutil
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path

import diffusers
import torch
from diffusers import DDPMScheduler, DiffusionPipeline, ImagePipelineOutput
from diffusers.schedulers.scheduling_utils import SchedulerMixin

from denoiser.guidance import guidance_for, read_sampling_defaults
from denoiser.model_dir import CLASSES_FILE, load_model, read_classes
from denoiser.sample import sample
from denoiser.unet import UNet

__all__ = ["DenoiserPipeline", "save_pipeline"]


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
        guidance_interval: Sequence[float] | None = None,  # last: the earlier arguments keep their positions
    ) -> ImagePipelineOutput | tuple:
        """Generate `batch_size` images.

        class_labels: an int, a class name (`pipe.classes`) or one per image; None samples the "no class" row.
        guidance_scale (classifier-free, needs a class), pag_scale/pag_layers (perturbed-attention),
        guide_model/guide_scale (autoguidance, a folder), guidance_interval ([lo, hi] timesteps the guidance
        applies at): denoiser.guidance; None takes sampling.json's value.
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
            load_guide=self._load_guide, has_class=labels is not None, guidance_interval=guidance_interval,
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

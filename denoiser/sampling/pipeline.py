"""The model as a diffusers pipeline: `DenoiserPipeline`, and model folders written atomically
(`save_pipeline`); reading and finding them is denoiser/folders/model_dir.py.

A model folder is what `DenoiserPipeline.save_pretrained` writes (`model_index.json`, `unet/`,
`scheduler/`: its best measured sampler on the model's noise schedule, DDIM as `save_pipeline` writes it; weights/emoji's
is UniPC) plus `classes.txt` (class names)
and `sampling.json` (measured default guidance and steps). `DenoiserPipeline.from_pretrained(folder)` loads
it through diffusers' public API alone, and so does `DiffusionPipeline.from_pretrained(folder)` after
`import denoiser` (denoiser.sampling.registry); either samples as `denoiser sample` does. diffusers' own
`DDPMPipeline`/`DDIMPipeline` still load it (without classes or guidance).
"""

from __future__ import annotations

import copy
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from diffusers import DDPMScheduler, DiffusionPipeline, ImagePipelineOutput
from diffusers.schedulers.scheduling_utils import SchedulerMixin

from denoiser.atomic import atomic_path
from denoiser.folders.model_dir import CLASSES_FILE, LoadedModel, ModelDefaults, TextModel, load
from denoiser.model.text import HashTextEncoder, WordHashTokenizer
from denoiser.model.unet import UNet
from denoiser.request import BUILT_IN, GuidanceRequest, PromptEdit, SampleRequest
from denoiser.sampling.loop import make_sampler
from denoiser.sampling.plan import resolve, run

__all__ = ["DenoiserPipeline", "save_pipeline"]

# model folders name each component's module in model_index.json (["denoiser.model.unet", "UNet"]); those a person
# wrote before the package had rooms name the old paths, which diffusers looks up in sys.modules
# (tests/sampling/test_registry.py::test_folders_that_name_the_modules_before_the_rooms_still_load)
MOVED = {"denoiser.unet": "denoiser.model.unet", "denoiser.text": "denoiser.model.text"}
for _old, _new in MOVED.items():
    sys.modules.setdefault(_old, sys.modules[_new])


class DenoiserPipeline(DiffusionPipeline):
    """Class-conditional, guided sampling of a denoiser UNet in diffusers' pipeline shape.

        pipe = DenoiserPipeline.from_pretrained("weights/cifar10")    # or DiffusionPipeline's, after `import denoiser`
        images = pipe(4, class_labels="cat", generator=[torch.Generator().manual_seed(k) for k in range(4)]).images

    A call is a `denoiser.request.SampleRequest` run by `denoiser.sampling.plan`, so it gives the images every other
    front door gives: with one generator per image seeded S + k, those of `denoiser sample --seed S`. Arguments
    left out come from the folder: its scheduler (trailing timesteps for the shipped models: DDIM for weights/cifar10, UniPC for weights/emoji; any
    diffusers scheduler may be swapped in, `pipe.scheduler = DDPMScheduler.from_config(pipe.scheduler.config)`),
    its sampling.json's guidance (`pipe.sampling_defaults`) and step count (`pipe.defaults.steps`) and its classes.txt
    (`pipe.classes`).
    """

    model_cpu_offload_seq = "text_encoder->unet"
    _callback_tensor_inputs = ["latents"]
    _optional_components = ["text_encoder", "tokenizer"]  # a text model's (denoiser.model.text); None for a class model

    def __init__(self, unet: UNet, scheduler: SchedulerMixin, text_encoder: HashTextEncoder | None = None,
                 tokenizer: WordHashTokenizer | None = None):
        super().__init__()
        if (text_encoder is None) != (tokenizer is None):
            raise ValueError("a text model needs both its text_encoder and its tokenizer (or neither, for a class model)")
        if text_encoder is not None and unet.config.cross_attention_dim != text_encoder.config.hidden_size:
            raise ValueError(f"the text encoder's width {text_encoder.config.hidden_size} must equal the UNet's "
                             f"cross_attention_dim {unet.config.cross_attention_dim}")
        self.register_modules(unet=unet, scheduler=scheduler, text_encoder=text_encoder, tokenizer=tokenizer)
        self._classes: tuple[str, ...] | None = None
        self._guides: dict[str, tuple] = {}
        self._model: tuple[tuple, LoadedModel] | None = None  # (its components, the model built of them)

    @property
    def folder(self) -> Path | None:
        """The local folder this pipeline was loaded from (None: built in memory or from the Hub)."""
        name = self.name_or_path
        return Path(name) if name and Path(name).is_dir() else None

    @property
    def classes(self) -> list[str]:
        """Class names by label (classes.txt; indices where the folder has none); [] for an unconditional model."""
        return list(self.loaded().defaults.classes)

    @classes.setter
    def classes(self, names: Sequence[str]) -> None:
        n = self.unet.config.num_class_embeds or 0
        if len(names) != n:
            raise ValueError(f"this model has {n} classes, got {len(names)} names")
        self._classes = tuple(str(c) for c in names)

    @property
    def defaults(self) -> ModelDefaults:
        """What the folder says about sampling this model (denoiser.folders.model_dir.read_defaults), read once."""
        return self.loaded().defaults

    def loaded(self) -> LoadedModel:
        """This pipeline as the one model every door samples: built from its components once, and again only when
        one of them is swapped (its scheduler, say); the folder's files read then. Its scheduler samples unless a
        call names another; class names set on the pipeline win over the folder's."""
        parts = (self.unet, self.scheduler, self.text_encoder, self.tokenizer, self.folder, self._classes)
        if self._model is None or any(a is not b and a != b for a, b in zip(self._model[0], parts)):
            text = TextModel(self.tokenizer, self.text_encoder) if self.text_encoder is not None else None
            self._model = (parts, LoadedModel.of(self.unet, self.scheduler, text, self.folder, classes=self._classes))
        return self._model[1]

    @property
    def sampling_defaults(self) -> dict:
        """The folder's sampling.json guidance: what a call without guidance arguments uses."""
        return dict(self.defaults.guidance or {})

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
        num_inference_steps: int | None = None,
        generator: torch.Generator | list[torch.Generator] | None = None,
        eta: float = 0.0,
        output_type: str = "pil",
        return_dict: bool = True,
        callback_on_step_end: Callable[[DiffusionPipeline, int, int, dict], dict] | None = None,
        callback_on_step_end_tensor_inputs: Sequence[str] = ("latents",),
        guidance_interval: Sequence[float] | None = None,  # from here on: new arguments, the earlier keep their positions
        timestep_spacing: str | None = None,
        prompt: str | Sequence[str] | None = None,
        negative_prompt: str | Sequence[str] | None = None,
        cross_attention_kwargs: dict | None = None,
    ) -> ImagePipelineOutput | tuple:
        """Generate `batch_size` images.

        class_labels: an int, a class name (`pipe.classes`), one per image, or "spread"; None samples "no class".
        prompt, negative_prompt (a text model): one for all images or one per image ("" or None: no condition);
        a list of prompts with batch_size left at 1 gives one image per prompt. guidance_scale steers from the
        negative prompt towards the prompt (as diffusers' text-to-image pipelines).
        guidance_scale (classifier-free, needs a class), pag_scale/pag_layers (perturbed-attention),
        guide_model/guide_scale (autoguidance, a folder), guidance_interval ([lo, hi] timesteps the guidance
        applies at): denoiser.sampling.guidance; None takes sampling.json's value. num_inference_steps None: sampling.json's,
        else denoiser.request.BUILT_IN's. timestep_spacing: "leading", "trailing" or "linspace" instead of the scheduler's.
        generator: one per image (image k seeded S + k gives `denoiser sample --seed S`'s image k), one for the
        whole batch, or None (a random seed).
        output_type: "pil" (list of PIL images), "np" ((B, H, W, C) floats in [0, 1]) or "pt" ((B, C, H, W)).
        callback_on_step_end(pipe, i, t, {"latents": x}) runs after every step and may return new latents.
        cross_attention_kwargs: prompt-to-prompt, as diffusers' community Prompt2PromptPipeline takes it:
        prompt=["red heart", "blue heart"], cross_attention_kwargs={"edit_type": "replace", "cross_replace_steps": 0.4,
        "self_replace_steps": 0.4} returns the source and the edit, both from image 0's noise (the generator's first
        draw); "refine" adds words, "reweight" scales `equalizer_words` by `equalizer_strengths`
        (denoiser.sampling.prompt_to_prompt). Prompts weigh words as A1111: "(red:1.5) heart".
        """
        if output_type not in ("pil", "np", "pt"):
            raise ValueError(f"output_type must be 'pil', 'np' or 'pt', got {output_type!r}")
        unknown = set(callback_on_step_end_tensor_inputs) - set(self._callback_tensor_inputs)
        if unknown:
            raise ValueError(f"callback_on_step_end_tensor_inputs: only {self._callback_tensor_inputs} exist, got {sorted(unknown)}")
        if prompt is not None and not isinstance(prompt, str) and batch_size == 1:
            batch_size = len(prompt)  # diffusers' convention: a list of prompts, one image each
        edit = None if cross_attention_kwargs is None else PromptEdit.from_kwargs(cross_attention_kwargs)
        request = SampleRequest(
            num_images=batch_size, classes=class_labels, batch_size=batch_size, prompts=prompt,
            negative_prompts=negative_prompt, steps=num_inference_steps,
            timestep_spacing=timestep_spacing, eta=eta, edit=edit,
            guidance=GuidanceRequest(guidance_scale=guidance_scale, pag_scale=pag_scale, pag_layers=pag_layers,
                                     guide_model=None if guide_model is None else str(guide_model), guide_scale=guide_scale,
                                     guidance_interval=guidance_interval),
            seed=int(torch.randint(0, 2**31 - 1, ())) if generator is None else 0,  # None: a random seed, as diffusers
        )
        plan = resolve(request, self.loaded(), load=self._load_guide)

        def after_step(i: int, x: torch.Tensor) -> torch.Tensor:
            if callback_on_step_end is not None:  # sample() has set the scheduler's timesteps by now
                x = callback_on_step_end(self, i, plan.scheduler.timesteps[i], {"latents": x}).get("latents", x)
            bar.update()
            return x

        with self.progress_bar(total=plan.steps) as bar:
            images = run(plan, generator=generator, after_step=after_step).images  # (B, C, H, W) in [0, 1]
        self.maybe_free_model_hooks()
        if output_type != "pt":
            images = images.permute(0, 2, 3, 1).numpy()  # (B, H, W, C)
            if output_type == "pil":
                images = self.numpy_to_pil(images)
        return ImagePipelineOutput(images=images) if return_dict else (images,)

    def _load_guide(self, folder: Path) -> LoadedModel:
        key = str(Path(folder).resolve())
        if key not in self._guides:
            self._guides[key] = load(folder, device=self.unet.device, channels_last=False)
        return self._guides[key]

    def save_pretrained(self, save_directory: str | Path, **kwargs) -> None:
        """diffusers' save_pretrained, plus classes.txt when the classes have names."""
        super().save_pretrained(save_directory, **kwargs)
        n = self.unet.config.num_class_embeds or 0
        if self.classes != [str(i) for i in range(n)]:
            (Path(save_directory) / CLASSES_FILE).write_text("\n".join(self.classes) + "\n")


def save_pipeline(
    unet: UNet, scheduler: DDPMScheduler, out_dir: str | Path, dtype: torch.dtype | None = None,
    classes: Sequence[str] | None = None, text_encoder: HashTextEncoder | None = None,
    tokenizer: WordHashTokenizer | None = None,
) -> Path:
    """Write a DenoiserPipeline folder to a temporary sibling, then swap it into place (denoiser.atomic).

    An existing folder is only replaced once the new one is complete; `dtype` (e.g. torch.float16)
    shrinks the shipped weights, and `denoiser.folders.model_dir.load` upcasts them again; `classes` names the class labels;
    `text_encoder` and `tokenizer` make a text model's folder (text_encoder/, tokenizer/).
    The folder's scheduler is the built-in sampler (denoiser.request.BUILT_IN: DDIM) on the training scheduler's noise
    schedule (and its timestep spacing): what every front door, diffusers' `from_pretrained` included, samples with
    unless told otherwise (a shipped folder may name its measured best instead: weights/emoji's is UniPC).
    """
    # safetensors stores contiguous tensors: undo channels-last (on a copy) before saving
    unet = copy.deepcopy(unet).to(memory_format=torch.contiguous_format)
    if dtype is not None:
        unet = unet.to(dtype=dtype)
    if text_encoder is not None:
        text_encoder = copy.deepcopy(text_encoder).to(dtype=dtype) if dtype is not None else text_encoder
    sampler = make_sampler(BUILT_IN["scheduler"], scheduler.config)
    pipe = DenoiserPipeline(unet=unet, scheduler=sampler, text_encoder=text_encoder, tokenizer=tokenizer)
    if classes is not None:
        pipe.classes = classes
    with atomic_path(out_dir) as tmp:
        pipe.save_pretrained(tmp, safe_serialization=True)
    return Path(out_dir)

"""Guidance: how one sampling step's prediction is combined from several UNet passes.

    out = ε_u + w·(ε_c − ε_u)  +  s·(ε_c − ε_p)  +  (a − 1)·(ε_c − ε_g)

- ε_c: the model with the class (or "no class" when none is given) or the prompt: the plain prediction.
- ε_u: the model with the "no class" row, or a text model with the negative prompt ("" = no condition) —
  classifier-free guidance, scale w (Ho & Salimans 2022); without it the first term is just ε_c.
- ε_p: the model with chosen self-attention layers' weights replaced by the identity, each pixel
  attending only to itself — perturbed-attention guidance, scale s (Ahn et al. 2024, eq. 11 combines it
  with CFG exactly this way: both directions start at the conditional prediction).
- ε_g: a guide model, a smaller or less-trained model of the same data — autoguidance, weight a
  (Karras et al. 2024: D = D_g + a·(D − D_g), which is ε_c + (a − 1)·(ε_c − ε_g)).

w = 1, s = 0 and a = 1 switch each term off and cost nothing. ε-, v- and x₀-predictions are affine in
each other for a fixed x_t, so combining outputs equals combining denoised images D (Karras' form).
The main model's passes (class, no class, perturbed) run as one batch (on a CPU, in calls of at most
ROWS_PER_CALL rows, each on whole images); the guide runs its own call.

A guidance interval [t_lo, t_hi] (Kynkäänniemi et al. 2024, "Applying Guidance in a Limited Interval Improves
Sample and Distribution Quality") applies the terms only at timesteps inside it; the other steps take the plain
prediction ε_c in one pass. Their finding: guidance at the highest noise levels pulls every sample of a class
towards one layout (diversity lost), at the lowest it changes little. On weights/cifar10 CFG 3 on t = 80..580
kept the FID of CFG 3 everywhere at 0.73x the time, without improving it (bench/guidance_cifar10.md).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from torch import nn

from denoiser.model.attention import CAPTURES, attention_layer_names
from denoiser.model.attention_blocks import edit_attention, identity_attention
from denoiser.model.attention_edit import AttentionEdit
from denoiser.request import PromptEdit
from denoiser.sampling.prompt_to_prompt import EditPlan, edit_plan

__all__ = ["Guidance", "TextCondition", "default_pag_layers", "check_guide", "ROWS_PER_CALL"]

# Most rows in one UNet call on a CPU: 128 rows (64 images with guidance) ran 1.2-1.3x slower per row than calls of 32,
# whose first-level feature maps (rows x 64 channels x 32x32 floats) are 8 MB, not 33 MB (bench/sample_batch.md)
ROWS_PER_CALL = 32


@dataclass
class TextCondition:
    """A text model's prompts for one batch, encoded: what its UNet calls take as encoder_hidden_states/_attention_mask.
    The negative prompts are the classifier-free guidance's unconditional rows ("": all padding, no condition).

    Weighted words ("(red:1.5) apple", denoiser.sampling.prompt_weights) scale their cross-attention; a prompt-to-prompt
    edit (denoiser.sampling.prompt_to_prompt) gives images 1.. image 0's attention maps. `attention(model, rows, t)` is the
    context every UNet call of a step runs in."""

    states: torch.Tensor  # (B, L, D) the prompts' token vectors
    mask: torch.Tensor  # (B, L) bool, True = a word
    negative_states: torch.Tensor  # (B, L', D) the negative prompts'
    negative_mask: torch.Tensor  # (B, L') bool
    scale: torch.Tensor | None = None  # (B, L) each word's weight, from "(word:w)"; None: every word 1
    negative_scale: torch.Tensor | None = None  # (B, L') the negative prompts' word weights; None: 1
    edit: EditPlan | None = None  # prompt-to-prompt over these images (image 0 the source); None: none

    @classmethod
    def encode(cls, tokenizer, text_encoder: nn.Module, prompts: Sequence, negative: Sequence | None = None,
               *, weighted: bool = True, edit: PromptEdit | None = None) -> TextCondition:
        """Encode the prompts; weighted: read "(word:w)" as a weight (False: training captions, taken as written).
        A prompt is its text or, read already (a Plan's, `denoiser.sampling.prompt_weights.WeightedPrompt`), its parse."""
        from denoiser.model.text import encode_prompts
        from denoiser.sampling.prompt_weights import WeightedPrompt, parse_prompt

        negative = [""] * len(prompts) if negative is None else list(negative)
        L_max = tokenizer.config.max_length
        parsed = [[p if isinstance(p, WeightedPrompt) else parse_prompt(p) for p in group]
                  for group in (prompts, negative)] if weighted else None
        texts = [[p.text for p in group] for group in parsed] if weighted else [list(prompts), negative]
        with torch.inference_mode():
            states, mask = encode_prompts(tokenizer, text_encoder, texts[0])
            neg, neg_mask = encode_prompts(tokenizer, text_encoder, texts[1])
        scales = [None, None]
        if weighted and any(p.weighted for group in parsed for p in group):
            scales = [_word_weights(group, L, L_max, states.device) for group, L in zip(parsed, (mask.shape[1], neg_mask.shape[1]))]
        plan = None if edit is None else edit_plan(edit, [tokenizer.tokens(t) for t in texts[0]])
        return cls(states, mask.bool(), neg, neg_mask.bool(), scales[0], scales[1], plan)

    def _groups(self, rows: str) -> tuple[list[tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]], int]:
        parts = [(self.states, self.mask, self.scale) if r == "c" else
                 (self.negative_states, self.negative_mask, self.negative_scale) for r in rows]
        return parts, max(m.shape[1] for _, m, _ in parts)

    def kwargs(self, rows: str) -> dict[str, torch.Tensor]:
        """UNet keyword arguments for a batch of row groups: "c" the prompts, "u" the negative prompts, e.g. "cuc"
        for [cond, uncond, perturbed]; token axes padded to the longest (padding has weight exactly 0)."""
        parts, L = self._groups(rows)
        states = torch.cat([nn.functional.pad(x, (0, 0, 0, L - x.shape[1])) for x, _, _ in parts])  # (n·B, L, D)
        mask = torch.cat([nn.functional.pad(m, (0, L - m.shape[1])) for _, m, _ in parts])  # (n·B, L)
        return {"encoder_hidden_states": states, "encoder_attention_mask": mask}

    def attention(self, model: nn.Module, rows: str, t) -> contextlib.AbstractContextManager:
        """The attention edits a UNet call on row groups `rows` runs with at timestep t: the words' weights and the
        prompt-to-prompt maps (none: a null context, and the call is exactly the plain one)."""
        parts, L = self._groups(rows)
        scale = None
        if any(s is not None for _, _, s in parts):
            scale = torch.cat([torch.ones(m.shape[0], L, device=m.device) if s is None else
                               nn.functional.pad(s, (0, L - s.shape[1]), value=1.0) for _, m, s in parts])  # (n·B, L)
        if self.edit is not None:
            self_edit, cross_edit = self.edit.edits(t, rows, scale, L)
        else:
            self_edit, cross_edit = None, None if scale is None else AttentionEdit(scale=scale)
        if self_edit is None and cross_edit is None:
            return contextlib.nullcontext()
        return edit_attention(model, self_edit, cross_edit)

    def images(self, start: int, stop: int) -> TextCondition:
        """The condition of images start..stop-1 (without a prompt-to-prompt edit: its images depend on image 0)."""
        if self.edit is not None:
            raise ValueError("a prompt-to-prompt edit's images attend together: keep them in one batch")

        def rows(x):
            return None if x is None else x[start:stop]

        return TextCondition(rows(self.states), rows(self.mask), rows(self.negative_states), rows(self.negative_mask),
                             rows(self.scale), rows(self.negative_scale))

    def at_timesteps(self, timesteps: Sequence) -> TextCondition:
        """This condition with its edit counting steps on the sampler's `timesteps` (a no-op without an edit)."""
        if self.edit is None:
            return self
        return dataclasses.replace(self, edit=self.edit.at_timesteps(timesteps))

    def to(self, device, dtype=None) -> TextCondition:
        def move(x):
            return None if x is None else x.to(device)

        edit = None if self.edit is None else self.edit.to(device)
        return TextCondition(self.states.to(device, dtype), self.mask.to(device), self.negative_states.to(device, dtype),
                             self.negative_mask.to(device), move(self.scale), move(self.negative_scale), edit)


def _word_weights(group, L: int, max_length: int, device) -> torch.Tensor:
    """(B, L) the parsed prompts' word weights (the first max_length words, as the tokenizer keeps), 1 at padding."""
    out = torch.ones(len(group), L)
    for b, p in enumerate(group):
        w = p.weights[:max_length]
        out[b, : len(w)] = torch.tensor(w, dtype=out.dtype)
    return out.to(device)


def default_pag_layers(unet: nn.Module) -> tuple[str, ...]:
    """The layers perturbed when none are named: the attention of the up path's first (lowest-resolution)
    level, e.g. up.0.attn.0-2 of weights/cifar10. Measured there (bench/attention_ablation_cifar10.md, the
    guidance table): switching these changes ε by a few percent at every noise level, enough to steer by;
    the middle block changes it by under 1% (PAG does little), the 16x16 layers by up to 30x at high noise
    (PAG explodes). Models without such layers use the middle block, else every layer."""
    names = attention_layer_names(unet)
    first_up = tuple(n for n in names if n.startswith("up.0.attn."))
    if first_up:
        return first_up
    return ("mid_attn",) if "mid_attn" in names else tuple(names)


@dataclass(frozen=True)
class Guidance:
    """The guidance of a sampling run; `Guidance()` is none (one UNet pass per step)."""

    scale: float = 1.0  # classifier-free guidance w (1 = off); needs a class-conditional model and a class
    pag_scale: float = 0.0  # perturbed-attention guidance s (0 = off)
    pag_layers: tuple[str, ...] | None = None  # attention layers switched to identity (or "a,b"); None: default_pag_layers
    guide: nn.Module | None = field(default=None, compare=False)  # autoguidance's guide model (check_guide)
    guide_scale: float = 1.0  # autoguidance weight a (1 = off)
    interval: tuple[float, float] | None = None  # timesteps [lo, hi] the terms apply at (both ends in); None: every step

    def __post_init__(self) -> None:
        for name, value in (("guidance scale", self.scale), ("PAG scale", self.pag_scale), ("guide scale", self.guide_scale)):
            if not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ValueError(f"{name} must be a finite number, got {value!r}")
        if self.scale < 1.0:
            raise ValueError(f"classifier-free guidance scale must be >= 1 (1 = off), got {self.scale}")
        if self.pag_scale < 0.0:
            raise ValueError(f"PAG scale must be >= 0 (0 = off), got {self.pag_scale}")
        if self.guide_scale < 1.0:
            raise ValueError(f"autoguidance weight must be >= 1 (1 = off), got {self.guide_scale}")
        if self.guide_scale != 1.0 and self.guide is None:
            raise ValueError("autoguidance (guide scale != 1) needs a guide model: pass --guide-model FOLDER")
        if self.pag_layers is not None:  # a comma-separated string (a command line's) or a list of names
            object.__setattr__(self, "pag_layers", _as_layers(self.pag_layers))
        if self.interval is not None:
            lo, hi = _as_interval(self.interval)
            object.__setattr__(self, "interval", (lo, hi))

    @property
    def classifier_free(self) -> bool:
        return self.scale != 1.0

    @property
    def pag(self) -> bool:
        return self.pag_scale != 0.0

    @property
    def autoguidance(self) -> bool:
        return self.guide is not None and self.guide_scale != 1.0

    @property
    def main_passes(self) -> int:
        """Batch rows of the main model per image and step: class, + no class (CFG), + perturbed (PAG)."""
        return 1 + self.classifier_free + self.pag

    def describe(self) -> str:
        parts = [f"CFG {self.scale:g}"] if self.classifier_free else []
        if self.pag:
            parts.append(f"PAG {self.pag_scale:g} on {', '.join(self.pag_layers or ('default',))}")
        if self.autoguidance:
            parts.append(f"autoguidance {self.guide_scale:g}")
        if parts and self.interval is not None:
            return " + ".join(parts) + f", at t in [{self.interval[0]:g}, {self.interval[1]:g}]"
        return " + ".join(parts) or "no guidance"

    def applies_at(self, t) -> bool:
        """Whether the guidance terms apply at timestep t (a number or a one-value tensor)."""
        if self.interval is None:
            return True
        t = float(torch.as_tensor(t).reshape(-1)[0])
        return self.interval[0] <= t <= self.interval[1]

    def check(self, unet: nn.Module, has_class: bool, has_text: bool = False) -> None:
        """Before any work: the model can give what each term needs, with a class label (`has_class`) or a text
        condition (`has_text`) or neither (what is checked needs no prompt encoded)."""
        if has_text and getattr(unet.config, "cross_attention_dim", None) is None:
            raise ValueError("a prompt was given but this model takes no text (it has no cross-attention): use its classes")
        if self.classifier_free and not has_class and not has_text:
            if getattr(unet.config, "cross_attention_dim", None) is not None:
                raise ValueError("classifier-free guidance (guidance_scale != 1) on a text model needs a prompt: give "
                                 "one, or set guidance to 1")
            raise ValueError(
                "guidance needs a class: classifier-free guidance (guidance_scale != 1) needs a class-conditional model "
                "and a class label; pick a class or set guidance to 1 (perturbed-attention guidance and autoguidance "
                "need no class)"
            )
        if self.pag:
            names = attention_layer_names(unet)
            if not names:
                raise ValueError("perturbed-attention guidance needs a model with attention layers; set the PAG scale to 0")
            unknown = [n for n in self.layers_for(unet) if n not in names]
            if unknown:
                raise ValueError(f"unknown PAG layer(s) {', '.join(unknown)}; this model has: {', '.join(names)}")

    def layers_for(self, unet: nn.Module) -> tuple[str, ...]:
        return self.pag_layers if self.pag_layers is not None else default_pag_layers(unet)

    def passes_per_step(self, timesteps: Sequence | None = None, guide_cost: float = 1.0) -> float:
        """UNet passes per image and step, averaged over the `timesteps` a sampler visits (None: every step
        guided, an upper bound); the guide's call counts `guide_cost` (its cost relative to the main model's).
        Outside the interval a step takes one pass."""
        extra = self.main_passes - 1 + (guide_cost if self.autoguidance else 0.0)
        if timesteps is None:
            return 1.0 + extra
        timesteps = list(timesteps)
        guided = sum(self.applies_at(t) for t in timesteps) / max(len(timesteps), 1)
        return 1.0 + guided * extra

    def main_pass(self, unet: nn.Module, x: torch.Tensor, t, labels: torch.Tensor | None,
                  text: TextCondition | None = None, applies: bool | None = None) -> list[torch.Tensor]:
        """The main model's outputs [ε_c, (ε_u), (ε_p)]: the rows each term needs, batched into one UNet call; [ε_c]
        alone outside the interval. applies: `applies_at(t)`, when the caller has it already (None: asked here).

        On a CPU a batch of more than ROWS_PER_CALL rows runs as several such calls, each on whole images: the same
        function of each image (the images came out the same to the pixel, bench/sample_batch.md), with feature maps
        that stay in the caches. The whole batch stays one call where it must: while attention is captured (the
        records are the call's), and under a prompt-to-prompt edit (its images read image 0's maps)."""
        applies = self.applies_at(t) if applies is None else applies
        per_call = max(1, ROWS_PER_CALL // (self.main_passes if applies else 1))  # images per call
        B = x.shape[0]
        if B <= per_call or x.device.type != "cpu" or CAPTURES.active() or (text is not None and text.edit is not None):
            return self._one_call(unet, x, t, labels, text, applies)
        calls = [self._one_call(unet, x[i : i + per_call], t, None if labels is None else labels[i : i + per_call],
                                None if text is None else text.images(i, i + per_call), applies)
                 for i in range(0, B, per_call)]
        return [torch.cat(term) for term in zip(*calls)]  # each term (B, C, H, W), the images in order

    def _one_call(self, unet: nn.Module, x: torch.Tensor, t, labels: torch.Tensor | None, text: TextCondition | None,
                  applies: bool) -> list[torch.Tensor]:
        """main_pass's terms for images x, in one UNet call."""
        if not applies:
            return [_call(unet, x, t, labels, text, "c")]
        B = x.shape[0]
        n = self.main_passes
        batch_labels = labels
        if self.classifier_free and labels is not None:
            null = torch.full_like(labels, unet.config.num_class_embeds)  # the "no class" embedding row
            batch_labels = torch.cat([labels, null] + ([labels] if self.pag else []))  # (n·B,)
        elif self.pag and labels is not None:
            batch_labels = torch.cat([labels, labels])
        x_in = torch.cat([x] * n) if n > 1 else x  # (n·B, C, H, W)
        switch = (
            identity_attention(unet, self.layers_for(unet), batch_start=(n - 1) * B) if self.pag else contextlib.nullcontext()
        )
        rows = "c" + "u" * self.classifier_free + "c" * self.pag  # which prompts each row group takes
        with switch:
            out = _call(unet, x_in, t, batch_labels, text, rows)
        return list(out.split(B))  # n x (B, C, H, W)

    def predictor(self, unet: nn.Module, labels: torch.Tensor | None, text: TextCondition | None = None,
                  ) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
        """predict(x, t) -> the guided output for one step (see the module docstring)."""
        self.check(unet, labels is not None, text is not None)

        def predict(x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
            applies = self.applies_at(t)
            parts = self.main_pass(unet, x, t, labels, text, applies)
            cond = parts[0]
            if not applies:
                return cond  # outside the interval: ε_c alone
            out = parts[1] + self.scale * (cond - parts[1]) if self.classifier_free else cond
            if self.pag:
                out = out + self.pag_scale * (cond - parts[-1])
            if self.autoguidance:
                guided = _call(self.guide, x, t, labels, text, "c")
                out = out + (self.guide_scale - 1.0) * (cond - guided)
            return out

        return predict


def _call(model: nn.Module, x: torch.Tensor, t, labels: torch.Tensor | None, text: TextCondition | None,
          rows: str) -> torch.Tensor:
    """One UNet call on row groups `rows` (text rows: "c" prompts, "u" negative prompts), with the prompts' attention
    edits (weighted words, prompt-to-prompt) open around it."""
    if text is None:
        return model(x, t, class_labels=labels).sample
    with text.attention(model, rows, t):
        return model(x, t, class_labels=labels, **text.kwargs(rows)).sample


def check_guide(unet: nn.Module, scheduler_config, guide: nn.Module, guide_scheduler_config, name: str = "guide") -> None:
    """Autoguidance needs a guide of the same task: same image size, channels, classes, prediction type."""
    a, b = unet.config, guide.config
    for key in ("sample_size", "in_channels", "out_channels", "num_class_embeds"):
        if a.get(key) != b.get(key):
            raise ValueError(
                f"the {name} model has {key} = {b.get(key)} but the model has {a.get(key)}: a guide must be a smaller or "
                "less-trained model of the same data and classes"
            )
    for key in ("prediction_type", "num_train_timesteps", "beta_schedule"):
        if scheduler_config.get(key) != guide_scheduler_config.get(key):
            raise ValueError(
                f"the {name} model's scheduler has {key} = {guide_scheduler_config.get(key)!r} but the model's has "
                f"{scheduler_config.get(key)!r}: both must predict the same quantity on the same noise schedule"
            )


def _as_interval(value) -> tuple[float, float]:
    """[lo, hi] timesteps, checked: two finite numbers, 0 <= lo <= hi ("lo, hi" as text too: the app's field)."""
    if isinstance(value, str):
        value = value.replace(",", " ").split()
    try:
        lo, hi = (float(v) for v in value)
    except (TypeError, ValueError):
        raise ValueError(f"a guidance interval is two timesteps [lo, hi], e.g. [80, 580]; got {value!r}") from None
    if not (math.isfinite(lo) and math.isfinite(hi) and 0 <= lo <= hi):
        raise ValueError(f"a guidance interval needs timesteps 0 <= lo <= hi, got [{lo:g}, {hi:g}]")
    return lo, hi


def _as_layers(value: str | Sequence[str] | None) -> tuple[str, ...] | None:
    if value is None or isinstance(value, tuple):
        return value
    if isinstance(value, str):
        return tuple(v.strip() for v in value.split(",") if v.strip())
    return tuple(value)

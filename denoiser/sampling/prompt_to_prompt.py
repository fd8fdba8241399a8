"""Prompt-to-prompt editing (Hertz et al. 2022): change the words, keep the picture.

Image 0's prompt is the source ("red heart"); images 1.. are its edits ("blue heart"), all drawn from image 0's
starting noise and sampled in one batch. For the first part of the steps each edit takes the source's attention
weights, the same query pixel's, through the rule of `denoiser.model.attention_edit.AttentionEdit`:

- cross-attention, while a step is inside `cross_replace_steps`: an edit's word takes the weight of the source
  word it stands for. "replace" swaps words one for one (same number of words); "refine" adds words ("heart" ->
  "red heart"): the words the two prompts share take the source's maps, the new words keep their own;
  "reweight" takes the source's maps times `equalizer_strengths` for `equalizer_words`.
- self-attention, while a step is inside `self_replace_steps`: an edit takes the source's pixel-to-pixel maps,
  which hold the layout.

The fractions are those of diffusers' community `Prompt2PromptPipeline`: a float f is [0, f] of the steps, a
pair (a, b) is [a, b]; the cross-attention runs at steps i < int(f·(steps + 1)), the self-attention at
int(a·steps) <= i < int(b·steps), as its code counts them. Its README spells the fractions `cross_replace_steps` /
`self_replace_steps` and its code `n_cross_replace` / `n_self_replace`: both are read here. Only the
conditional rows are edited (the prompts', not the negative prompts'), as in the original code.

Both fractions at 0 is a plain generation of each prompt from image 0's noise. Each edit costs what one more
guided image costs (one batch row per guidance pass) and runs on the fused attention path.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import torch

from denoiser.model.attention_edit import AttentionEdit

__all__ = ["PromptEdit", "EditPlan", "EDIT_TYPES", "DEFAULT_CROSS_REPLACE", "DEFAULT_SELF_REPLACE", "word_map"]

EDIT_TYPES = ("replace", "refine", "reweight")
# chosen by the sweep in bench/prompt_to_prompt.md (8 colour swaps x 4 seeds on weights/emoji): the most shape kept
# (foreground IoU 0.902 against the plain target's 0.869) while the colour still moves >= 0.8 of the way the plain
# target's does (0.87). The self-attention fraction decides it; the cross-attention fraction changed no measure by
# more than 0.001 on that model (one token per word: a colour word's map is much like the one it replaces)
DEFAULT_CROSS_REPLACE = 0.4
DEFAULT_SELF_REPLACE = 0.4

_SPELLINGS = {"cross_replace_steps": "n_cross_replace", "self_replace_steps": "n_self_replace"}
_KEYS = {"edit_type", "equalizer_words", "equalizer_strengths", *_SPELLINGS, *_SPELLINGS.values()}


def _fraction(name: str, value) -> tuple[float, float]:
    """A step fraction f (-> [0, f]) or a pair [a, b], checked: 0 <= a <= b <= 1."""
    if isinstance(value, Mapping):
        raise ValueError(f"{name}: a fraction per word (a dict) is not supported here; give one fraction for every word, "
                         "e.g. 0.8, or a pair [start, end]")
    pair = (0.0, value) if isinstance(value, (int, float)) and not isinstance(value, bool) else value
    try:
        lo, hi = (float(v) for v in pair)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a fraction of the steps in 0..1 (e.g. 0.4) or a pair [start, end], got "
                         f"{value!r}") from None
    if not (math.isfinite(lo) and math.isfinite(hi) and 0.0 <= lo <= hi <= 1.0):
        raise ValueError(f"{name} must lie in 0..1 with start <= end, got {value!r}")
    return lo, hi


@dataclass(frozen=True)
class PromptEdit:
    """What a prompt-to-prompt call asks for: diffusers' community pipeline's `cross_attention_kwargs`, typed."""

    edit_type: str = "replace"  # one of EDIT_TYPES
    cross_replace_steps: tuple[float, float] = (0.0, DEFAULT_CROSS_REPLACE)  # steps whose word maps come from the source
    self_replace_steps: tuple[float, float] = (0.0, DEFAULT_SELF_REPLACE)  # steps whose pixel maps come from the source
    equalizer_words: tuple[str, ...] = ()  # "reweight": the words whose maps are scaled
    equalizer_strengths: tuple[float, ...] = ()  # "reweight": one factor for all those words, or one per word

    def __post_init__(self) -> None:
        if self.edit_type not in EDIT_TYPES:
            raise ValueError(f"edit_type must be one of {', '.join(EDIT_TYPES)}, got {self.edit_type!r}")
        object.__setattr__(self, "cross_replace_steps", _fraction("cross_replace_steps", self.cross_replace_steps))
        object.__setattr__(self, "self_replace_steps", _fraction("self_replace_steps", self.self_replace_steps))
        words = (self.equalizer_words,) if isinstance(self.equalizer_words, str) else tuple(self.equalizer_words)
        strengths = self.equalizer_strengths
        strengths = (strengths,) if isinstance(strengths, (int, float)) else tuple(strengths)
        object.__setattr__(self, "equalizer_words", words)
        object.__setattr__(self, "equalizer_strengths", tuple(float(s) for s in strengths))
        if self.edit_type == "reweight":
            if not words or not strengths:
                raise ValueError('edit_type "reweight" needs equalizer_words and equalizer_strengths, e.g. '
                                 '{"equalizer_words": ["red"], "equalizer_strengths": [2.0]}')
            if len(strengths) not in (1, len(words)):
                raise ValueError(f"give one equalizer strength, or one per word: {len(words)} words, {len(strengths)} "
                                 "strengths")
            if any(not (math.isfinite(s) and 0.0 <= s <= 10.0) for s in self.equalizer_strengths):
                raise ValueError(f"equalizer_strengths must lie in 0..10, got {list(self.equalizer_strengths)}")
        elif words or strengths:
            raise ValueError(f'equalizer_words and equalizer_strengths belong to edit_type "reweight", not '
                             f'{self.edit_type!r}')

    def describe(self) -> str:
        """E.g. "prompt-to-prompt replace: word maps from the source for steps 0-0.4, layout 0-0.4"."""
        (c0, c1), (s0, s1) = self.cross_replace_steps, self.self_replace_steps
        what = f"prompt-to-prompt {self.edit_type}: word maps from the source for steps {c0:g}-{c1:g}, layout {s0:g}-{s1:g}"
        if self.edit_type == "reweight":
            what += f", {', '.join(self.equalizer_words)} x{'/'.join(f'{s:g}' for s in self.equalizer_strengths)}"
        return what

    @classmethod
    def from_kwargs(cls, kwargs: Mapping) -> PromptEdit:
        """From the community pipeline's `cross_attention_kwargs`; either spelling of the fractions, unknown keys refused."""
        if not isinstance(kwargs, Mapping):
            raise TypeError(f"cross_attention_kwargs must be a dict, got {type(kwargs).__name__}")
        if "local_blend_words" in kwargs:
            raise ValueError("cross_attention_kwargs: local_blend_words (LocalBlend) is not supported: leave it out; the "
                             "self-attention injection (self_replace_steps) keeps the picture outside the edited words")
        unknown = sorted(set(kwargs) - _KEYS)
        if unknown:
            raise ValueError(f"cross_attention_kwargs: unknown key(s) {', '.join(map(repr, unknown))}; known: "
                             f"{', '.join(sorted(_KEYS))}")
        if "edit_type" not in kwargs:
            raise ValueError(f'cross_attention_kwargs needs "edit_type": one of {", ".join(EDIT_TYPES)}')
        args = {"edit_type": kwargs["edit_type"]}
        for readme, code in _SPELLINGS.items():
            if readme in kwargs and code in kwargs and kwargs[readme] != kwargs[code]:
                raise ValueError(f"cross_attention_kwargs gives both {readme}={kwargs[readme]!r} and {code}="
                                 f"{kwargs[code]!r}: they are one setting, give one")
            if readme in kwargs or code in kwargs:
                args[readme] = kwargs.get(readme, kwargs.get(code))
        for key in ("equalizer_words", "equalizer_strengths"):
            if key in kwargs:
                args[key] = kwargs[key]
        return cls(**args)

    def plan(self, words: Sequence[Sequence[str]]) -> EditPlan:
        """The maps for a batch whose image 0 has the source words and images 1.. an edit's words each."""
        if len(words) < 2:
            raise ValueError("prompt-to-prompt needs the source prompt and at least one edit: prompt=[source, edit, ...]")
        L = max(max(len(w) for w in words), 1)
        key_map = torch.full((len(words), L), -1, dtype=torch.long)
        equalizer = torch.ones(len(words), L)
        for b, target in enumerate(words[1:], start=1):
            for j, i in enumerate(word_map(self.edit_type, words[0], target)):
                key_map[b, j] = i
            if self.edit_type == "reweight":
                equalizer[b] = _equalizer(target, self.equalizer_words, self.equalizer_strengths, L)
        source = torch.tensor([-1] + [0] * (len(words) - 1))
        return EditPlan(self, source, key_map, equalizer if self.edit_type == "reweight" else None)


def word_map(edit_type: str, source: Sequence[str], target: Sequence[str]) -> list[int]:
    """For each target word, the source word whose map it takes (-1: its own). "replace"/"reweight": word for word;
    "refine": the words both prompts share, aligned in order (difflib), the added words -1."""
    if edit_type in ("replace", "reweight"):
        if len(source) != len(target):
            raise ValueError(f'edit_type "{edit_type}" swaps words one for one, but {" ".join(source)!r} has '
                             f'{len(source)} words and {" ".join(target)!r} {len(target)}: use edit_type "refine" to add '
                             "or remove words")
        return list(range(len(target)))
    out = [-1] * len(target)
    for block in difflib.SequenceMatcher(a=list(source), b=list(target), autojunk=False).get_matching_blocks():
        for n in range(block.size):
            out[block.b + n] = block.a + n
    return out


def _equalizer(target: Sequence[str], chosen: Sequence[str], strengths: Sequence[float], L: int) -> torch.Tensor:
    """(L,) factors: the strength for each word of `chosen` (a phrase counts word by word), 1 elsewhere."""
    from denoiser.model.text import words as split_words

    out = torch.ones(L)
    for n, phrase in enumerate(chosen):
        strength = strengths[0] if len(strengths) == 1 else strengths[n]
        parts = split_words(phrase)
        hits = [j for j, w in enumerate(target) if w in parts]
        if not parts or not hits:
            raise ValueError(f"equalizer word {phrase!r} is not in the edited prompt {' '.join(target)!r}")
        out[hits] = strength
    return out


@dataclass
class EditPlan:
    """A prompt-to-prompt edit resolved for one batch of images (image 0 the source): who takes whose maps."""

    edit: PromptEdit
    source: torch.Tensor  # (n,) long: -1 for the source image, 0 for each edit
    key_map: torch.Tensor  # (n, L) long: per edit word, the source word whose map it takes (-1: its own)
    equalizer: torch.Tensor | None  # (n, L) "reweight"'s factors
    timesteps: tuple[float, ...] = field(default=())  # the sampler's timesteps, to count steps by (`at_timesteps`)

    def to(self, device) -> EditPlan:
        eq = None if self.equalizer is None else self.equalizer.to(device)
        return EditPlan(self.edit, self.source.to(device), self.key_map.to(device), eq, self.timesteps)

    def at_timesteps(self, timesteps: Sequence) -> EditPlan:
        return EditPlan(self.edit, self.source, self.key_map, self.equalizer, tuple(float(t) for t in timesteps))

    def active(self, t) -> tuple[bool, bool]:
        """(cross, self): whether step t's cross- and self-attention take the source's maps."""
        if not self.timesteps:
            raise RuntimeError("the edit's steps are counted on the sampler's timesteps: call at_timesteps first")
        i = self.timesteps.index(float(torch.as_tensor(t).reshape(-1)[0]))
        steps = len(self.timesteps)
        (c_lo, c_hi), (s_lo, s_hi) = self.edit.cross_replace_steps, self.edit.self_replace_steps
        cross = int(c_lo * (steps + 1)) <= i < int(c_hi * (steps + 1))
        return cross, int(s_lo * steps) <= i < int(s_hi * steps)

    def edits(self, t, rows: str, scale: torch.Tensor | None, L: int) -> tuple[AttentionEdit | None, AttentionEdit | None]:
        """(self-attention's, cross-attention's) edit for step t on a batch of row groups ("c" prompts, "u" negative),
        each group the plan's n images; `scale` (len(rows)·n, L): the words' own weights, or None."""
        cross_on, self_on = self.active(t)
        n = self.source.shape[0]
        none = torch.full_like(self.source, -1)
        source = torch.cat([torch.where(self.source >= 0, self.source + g * n, none) if r == "c" else none
                            for g, r in enumerate(rows)])  # (len(rows)·n,): only the prompts' rows take a source
        self_edit = AttentionEdit(source=source) if self_on else None
        if not cross_on:
            return self_edit, None if scale is None else AttentionEdit(scale=scale)
        key_map = torch.nn.functional.pad(self.key_map, (0, L - self.key_map.shape[1]), value=-1)  # (n, L)
        key_map = torch.cat([key_map if r == "c" else torch.full_like(key_map, -1) for r in rows])  # (rows·n, L)
        if self.equalizer is not None:
            eq = torch.nn.functional.pad(self.equalizer, (0, L - self.equalizer.shape[1]), value=1.0)
            eq = torch.cat([eq if r == "c" else torch.ones_like(eq) for r in rows])
            scale = eq if scale is None else scale * eq.to(scale.dtype)
        return self_edit, AttentionEdit(scale=scale, source=source, key_map=key_map)


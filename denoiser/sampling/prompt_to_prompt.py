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
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from denoiser.model.attention_edit import AttentionEdit
from denoiser.request import PromptEdit

__all__ = ["EditPlan", "edit_plan", "word_map"]

def edit_plan(edit: PromptEdit, words: Sequence[Sequence[str]]) -> EditPlan:
    """`edit`'s maps for a batch whose image 0 has the source words and images 1.. an edit's words each."""
    if len(words) < 2:
        raise ValueError("prompt-to-prompt needs the source prompt and at least one edit: prompt=[source, edit, ...]")
    L = max(max(len(w) for w in words), 1)
    key_map = torch.full((len(words), L), -1, dtype=torch.long)
    equalizer = torch.ones(len(words), L)
    for b, target in enumerate(words[1:], start=1):
        for j, i in enumerate(word_map(edit.edit_type, words[0], target)):
            key_map[b, j] = i
        if edit.edit_type == "reweight":
            equalizer[b] = _equalizer(target, edit.equalizer_words, edit.equalizer_strengths, L)
    source = torch.tensor([-1] + [0] * (len(words) - 1))
    return EditPlan(edit, source, key_map, equalizer if edit.edit_type == "reweight" else None)


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


"""Weighted prompts in A1111's syntax: `(red:1.5) apple` gives the word "red" 1.5 times its attention.

    (text:w)   the words of `text` weigh w (a number, e.g. 1.5, 0.7, 2)
    (text)     weigh 1.1;  [text] weigh 1 / 1.1      (A1111's shorthands)
    nesting multiplies:  ((red):2) is 2.2;  \\( \\) \\[ \\] are literal brackets (dropped as punctuation)

The weight is not put into the text: the model reads the prompt with the brackets and weights taken out
("red apple"), and each word's weight scales that word's cross-attention after the softmax, in every
cross-attention layer and at every step (`denoiser.model.attention_edit`, the rule of prompt-to-prompt's reweight,
Hertz et al. 2022):

    weight'[pixel, word] = w_word · softmax(q kᵀ / √d)[pixel, word];  the other words' weights are unchanged

So a row no longer sums to one: it sums to 1 + Σ (w_j − 1)·a_j. A weight of 1 everywhere (and a prompt with no
brackets) is exactly the plain prompt. A1111 scales the text embeddings instead; scaling the attention keeps the
word's meaning and changes only how much of the picture it reaches, and it is what the word maps show.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from denoiser.model.text import words as split_words

__all__ = ["WeightedPrompt", "parse_prompt", "BRACKET_WEIGHT", "MAX_WEIGHT"]

BRACKET_WEIGHT = 1.1  # (text) multiplies by this, [text] divides by it (A1111)
MAX_WEIGHT = 10.0  # a word's weight lies in [0, MAX_WEIGHT]: beyond it the attention output is out of range

_NUMBER = re.compile(r"\s*([+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)\s*$")


@dataclass(frozen=True)
class WeightedPrompt:
    """A prompt with its weights taken out: `text` is what the text encoder reads, `weights` one per word of it."""

    source: str  # the prompt as typed, brackets and all
    text: str  # the words with the brackets and weights taken out
    words: tuple[str, ...]  # the words the tokenizer makes of `text` (denoiser.model.text.words)
    weights: tuple[float, ...]  # one per word

    @property
    def weighted(self) -> bool:
        """Whether any word's weight differs from 1 (if not, the prompt runs exactly as the plain text)."""
        return any(w != 1.0 for w in self.weights)


def parse_prompt(prompt: str) -> WeightedPrompt:
    """Split `prompt` into its plain text and a weight per word; a malformed weight is a ValueError naming its place."""
    if not isinstance(prompt, str):
        raise TypeError(f"a prompt must be text, got {type(prompt).__name__}")
    segments = _segments(prompt)  # [(text, weight)]
    text = " ".join(" ".join(t for t, _ in segments).split())  # the words as typed, single-spaced
    words, weights = [], []
    for part, weight in segments:
        for word in split_words(part):
            words.append(word)
            weights.append(weight)
    return WeightedPrompt(prompt, text, tuple(words), tuple(weights))


def _segments(prompt: str) -> list[tuple[str, float]]:
    """The prompt as runs of text with one weight each, reading brackets left to right."""
    out: list[tuple[str, float]] = []
    buf: list[str] = []
    spans = _match_brackets(prompt)  # a group's weight is only known at its ")": groups are read by their spans

    def flush(weight: float) -> None:
        if buf:
            out.append(("".join(buf), weight))
            buf.clear()

    def read(lo: int, hi: int, weight: float) -> None:
        j = lo
        while j < hi:
            c = prompt[j]
            if c == "\\" and j + 1 < hi and prompt[j + 1] in "()[]":
                buf.append(" ")  # a literal bracket is punctuation to the tokenizer: it separates words
                j += 2
                continue
            if c in "([":
                flush(weight)
                close = spans[j]
                inner_hi, factor = (close, 1 / BRACKET_WEIGHT) if c == "[" else _group_weight(prompt, j, close)
                read(j + 1, inner_hi, weight * factor)
                flush(weight * factor)
                j = close + 1
                continue
            buf.append(c)
            j += 1

    read(0, len(prompt), 1.0)
    flush(1.0)
    return out


def _match_brackets(prompt: str) -> dict[int, int]:
    """Each opening bracket's index -> its closing bracket's; unbalanced or crossed brackets are errors."""
    spans: dict[int, int] = {}
    open_: list[int] = []
    j = 0
    while j < len(prompt):
        c = prompt[j]
        if c == "\\" and j + 1 < len(prompt) and prompt[j + 1] in "()[]":
            j += 2
            continue
        if c in "([":
            open_.append(j)
        elif c in ")]":
            if not open_:
                raise ValueError(_where(prompt, j, f"'{c}' closes nothing: remove it, or write \\{c} for the character"))
            start = open_.pop()
            if (prompt[start], c) not in (("(", ")"), ("[", "]")):
                raise ValueError(_where(prompt, j, f"'{c}' closes the '{prompt[start]}' at {start + 1}: brackets must nest"))
            spans[start] = j
        j += 1
    if open_:
        k = open_[-1]
        closer = ")" if prompt[k] == "(" else "]"
        raise ValueError(_where(prompt, k, f"'{prompt[k]}' is never closed: add '{closer}', or write \\{prompt[k]} for "
                                           "the character"))
    return spans


def _group_weight(prompt: str, start: int, close: int) -> tuple[int, float]:
    """For the "(" group at `start`..`close`: (where its text ends, its weight). `(text:w)` gives w, `(text)` 1.1."""
    inner = prompt[start + 1 : close]
    colon = _last_top_level_colon(prompt, start + 1, close)
    if colon is None:
        return close, BRACKET_WEIGHT
    number = _NUMBER.match(prompt[colon + 1 : close])
    if number is None:
        raise ValueError(_where(prompt, colon + 1, f"the weight in '({inner})' is not a number: write (text:1.5), or "
                                                    "\\( for a literal bracket"))
    w = float(number.group(1))
    if not (math.isfinite(w) and 0.0 <= w <= MAX_WEIGHT):
        raise ValueError(_where(prompt, colon + 1, f"the weight {number.group(1)} is outside 0..{MAX_WEIGHT:g}: a word's "
                                                    "attention can be switched off (0) or made up to "
                                                    f"{MAX_WEIGHT:g} times stronger"))
    if not prompt[start + 1 : colon].strip():
        raise ValueError(_where(prompt, start, f"'({inner})' weighs no words: write (word:{number.group(1)})"))
    return colon, w


def _last_top_level_colon(prompt: str, lo: int, hi: int) -> int | None:
    """The last ':' inside the group lo..hi that is not inside a nested bracket (A1111 reads `(a (b:2):1.5)`)."""
    depth, found, j = 0, None, lo
    while j < hi:
        c = prompt[j]
        if c == "\\" and j + 1 < hi and prompt[j + 1] in "()[]":
            j += 2
            continue
        if c in "([":
            depth += 1
        elif c in ")]":
            depth -= 1
        elif c == ":" and depth == 0:
            found = j
        j += 1
    return found


def _where(prompt: str, index: int, message: str) -> str:
    """The error's text: the character's place (1-based) and the prompt, or the part of it around that place."""
    where = f"of {prompt!r}" if len(prompt) <= 60 else f"(near {prompt[max(0, index - 30) : index + 30]!r})"
    return f"prompt weighting, at character {index + 1} {where}: {message}"

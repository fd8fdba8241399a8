"""What a person should hear about how a text model reads a prompt, worded once: the app's notes under the prompt and
in the status line, and the log line of every door (`Plan.log_notes`). A prompt may be cut at the tokenizer's length,
read with its accents and marks dropped, or hold words no training caption held (the model draws them as a guess)."""

from __future__ import annotations

from collections.abc import Sequence

from denoiser.model.text import drops_marks
from denoiser.model.text import words as split_words
from denoiser.sampling.prompt_weights import WeightedPrompt

__all__ = ["unread_note", "read_as_note", "unseen_note"]


def unread_note(read: Sequence[str], unread: Sequence[str]) -> str:
    """Where a cut prompt is shown: that the model read only its first words (the tokenizer's max_length) and which it
    did not; "" for a prompt read whole."""
    if not unread:
        return ""
    rest = " ".join(unread)
    rest = rest if len(rest) <= 80 else rest[:80] + " …"
    return f"cut: the model reads only the first {len(read)} words; {len(unread)} more not read (“{rest}”)"


def read_as_note(prompt: WeightedPrompt) -> str:
    """Where a prompt is shown: how the model reads it (its parse, `denoiser.sampling.prompt_weights.parse_prompt`) when
    its tokenizer changed letters (accents and marks dropped, "赤いりんご" read as "赤いりんこ"); "" when it reads the
    letters typed."""
    if not prompt.text or not drops_marks(prompt.text):
        return ""
    read = " ".join(split_words(prompt.text))
    return f"read as “{read if len(read) <= 80 else read[:80] + ' …'}”: the tokenizer drops accents and marks"


def unseen_note(unseen: Sequence[str]) -> str:
    """Where a prompt is shown: its words no training caption held (the model folder's vocabulary), which the model
    draws from their letters alone; "" when it saw every word (or the folder keeps no vocabulary)."""
    if not unseen:
        return ""
    words = " ".join(unseen)
    words = words if len(words) <= 80 else words[:80] + " …"
    return f"never seen in training, drawn as a guess: “{words}”"

"""Prompts to token vectors: the tokenizer and text encoder of a text model folder (`tokenizer/`, `text_encoder/`).

    prompt "red apple" --WordHashTokenizer--> per word: hashed ids of the word and its character 2-4-grams
        --HashTextEncoder--> (B, L, D) one vector per word --UNet cross-attention--> the image

Why this design (measured in bench/text_encoder_choice.md): one token per word, so a word's attention map is
one map; no vocabulary, so no word is unknown and a typo shares most of its n-grams with the word it misspells;
no new dependency. The tokenizer may still *keep* the words its model's training captions held (`vocabulary.txt`
beside its config): not to encode them, only so that `unseen` can say which words of a prompt the model never
saw (it draws something for "日本" all the same, with nothing to go on). Both are diffusers `ModelMixin`s, so `DiffusionPipeline.from_pretrained` loads them from
`model_index.json` (["denoiser.model.text", "HashTextEncoder"]) as it loads a CLIP text encoder.

An empty prompt is a row of padding (attention_mask all 0): the UNet's cross-attention then passes its
input through, so "" means "no condition" (what caption dropout trains and classifier-free guidance uses).
"""

from __future__ import annotations

import functools
import os
import re
import unicodedata
from collections.abc import Iterable, Sequence
from pathlib import Path

import torch
from diffusers import ConfigMixin, ModelMixin
from diffusers.configuration_utils import register_to_config
from torch import nn

__all__ = ["words", "find_word", "fnv1a", "WordHashTokenizer", "HashTextEncoder", "encode_prompts", "prompts_from_file", "PromptedUNet"]

MAX_WORD_CHARS = 64  # a 10,000-letter "word" costs what a 64-letter one does


def words(text: str) -> list[str]:
    """Lower-cased words: accents stripped (NFKD), `_` splits, symbols such as `#` or `*` are words of their own
    (keycaps), sentence punctuation and invisible characters are dropped.  "Red apple!" -> ["red", "apple"]"""
    text = unicodedata.normalize("NFKD", text).replace("\u200b", " ")  # a zero-width space splits as a space does
    text = "".join(c for c in text if not (unicodedata.combining(c) or _invisible(c))).lower().replace("_", " ")
    return re.findall(r"[^\W_]+|[^\w\s:,.;!?'\"()\-\u2019]", text)


def find_word(prompt_words: Sequence[str], word: str) -> int:
    """The index of `word` among `prompt_words`, a prompt's words (`WordHashTokenizer.tokens`), normalised as the tokenizer
    normalises them (case, accents: "Café" finds "cafe"); the first where it occurs twice."""
    wanted = words(word)
    if len(wanted) != 1 or wanted[0] not in prompt_words:
        raise ValueError(f"{word!r} is not a word of the prompt; pick one of its words: {', '.join(prompt_words) or '(none)'}")
    return list(prompt_words).index(wanted[0])


def _invisible(c: str) -> bool:
    """A character that draws nothing and is no word: a format character (zero-width joiner, soft hyphen, byte-order
    mark) or a variation selector ("❤️" is "❤" and U+FE0F, which asks for its colour form)."""
    return unicodedata.category(c) == "Cf" or "\ufe00" <= c <= "\ufe0f" or "\U000e0100" <= c <= "\U000e01ef"


def drops_marks(text: str) -> bool:
    """Whether `words` changes letters of `text` beyond their case: accents and other marks dropped ("café" -> "cafe",
    "りんご" -> "りんこ"), which a person should be told."""
    return any(unicodedata.combining(c) for c in unicodedata.normalize("NFKD", text))


def fnv1a(s: str) -> int:
    """32-bit FNV-1a of the UTF-8 bytes: the same on every machine and process (Python's hash() is salted)."""
    h = 0x811C9DC5
    for b in s.encode("utf-8"):
        h = ((h ^ b) * 0x01000193) & 0xFFFFFFFF
    return h


class WordHashTokenizer(ModelMixin, ConfigMixin):
    """Prompts -> per word, the hashed bucket ids of `<word>` and its character n-grams (fastText's subwords).

    The config is the whole encoding. `vocabulary`, optional, is the training captions' texts (or words): kept
    as their `words`, it changes no id, and only `unseen` reads it. It is a ModelMixin (with no weights) only
    because diffusers loads a pipeline component whose class derives from one of its loadable bases; saving
    writes the config and, when there is a vocabulary, `vocabulary.txt` (one word a line, sorted).
    """

    config_name = "tokenizer_config.json"
    vocabulary_name = "vocabulary.txt"
    ignore_for_config = ["vocabulary"]  # a file of its own, not thousands of words in the config

    @register_to_config
    def __init__(self, num_buckets: int = 16384, min_n: int = 2, max_n: int = 4, max_length: int = 32,
                 max_ngrams: int = 24, vocabulary: Iterable[str] | None = None):
        super().__init__()
        if num_buckets < 2 or not 1 <= min_n <= max_n or max_length < 1 or max_ngrams < 1:
            raise ValueError(f"tokenizer: need num_buckets >= 2, 1 <= min_n <= max_n, max_length >= 1 and max_ngrams >= 1; "
                             f"got {num_buckets}, {min_n}, {max_n}, {max_length}, {max_ngrams}")
        if isinstance(vocabulary, str):
            raise TypeError("vocabulary must be a collection of texts, not one string")
        # None: the model's captions are not known (a folder saved before vocabularies), so no word is called unseen
        self.vocabulary: frozenset[str] | None = (
            None if vocabulary is None else frozenset(w for text in vocabulary for w in words(text)))

    def units(self, word: str) -> list[str]:
        """`<word>` itself, then the n-grams of `<word>`, at most max_ngrams in all."""
        c = self.config
        return _units(word, c.min_n, c.max_n, c.max_ngrams)

    def word_ids(self, word: str) -> tuple[int, ...]:
        """The bucket ids of `word`'s units (cached: a training step tokenizes hundreds of captions)."""
        c = self.config
        return _word_ids(word, c.num_buckets, c.min_n, c.max_n, c.max_ngrams)

    def tokens(self, prompt: str) -> list[str]:
        """The words of `prompt` that reach the model (the first max_length): one token, one attention map each."""
        return words(prompt)[: self.config.max_length]

    def dropped(self, prompt: str) -> list[str]:
        """The words past max_length, which the model never sees (callers warn about them)."""
        return words(prompt)[self.config.max_length :]

    def unseen(self, prompt: str) -> list[str]:
        """The words of `prompt` (as `tokens` reads them, each once, in order) that no training caption held;
        [] when the tokenizer has no vocabulary. The model still draws them, from their n-grams alone."""
        if self.vocabulary is None:
            return []
        return list(dict.fromkeys(w for w in self.tokens(prompt) if w not in self.vocabulary))

    def __call__(self, prompts: str | list[str]) -> dict[str, torch.Tensor]:
        """{"input_ids": (B, L, G) bucket ids, 0 where unused; "ngram_mask": (B, L, G) True where used;
        "attention_mask": (B, L) 1 = word, 0 = padding}. L is the batch's longest prompt in words (at least 1),
        G = max_ngrams. A prompt with no words ("", "!!") is a row of padding: no condition."""
        if isinstance(prompts, str):
            prompts = [prompts]
        if not all(isinstance(p, str) for p in prompts):
            raise TypeError(f"prompts must be strings, got {[type(p).__name__ for p in prompts][:4]}")
        batch = [self.tokens(p) for p in prompts]
        B, L, G = len(batch), max([1] + [len(ws) for ws in batch]), self.config.max_ngrams
        empty = (0,) * G
        rows = [[self.word_ids(w) for w in ws] for ws in batch]
        ids = [[list(u) + [0] * (G - len(u)) for u in r] + [empty] * (L - len(r)) for r in rows]
        used = [[[1] * len(u) + [0] * (G - len(u)) for u in r] + [empty] * (L - len(r)) for r in rows]
        return {
            "input_ids": torch.tensor(ids, dtype=torch.long).reshape(B, L, G),
            "ngram_mask": torch.tensor(used, dtype=torch.bool).reshape(B, L, G),
            "attention_mask": torch.tensor([[1] * len(r) + [0] * (L - len(r)) for r in rows], dtype=torch.long),  # (B, L)
        }

    def save_pretrained(self, save_directory: str | os.PathLike, **kwargs) -> None:
        """The config, and `vocabulary.txt` when there is a vocabulary (a tokenizer has no weights)."""
        self.save_config(save_directory)
        if self.vocabulary is not None:
            text = "".join(f"{w}\n" for w in sorted(self.vocabulary))
            (Path(save_directory) / self.vocabulary_name).write_text(text, encoding="utf-8")

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path: str | os.PathLike, subfolder: str | None = None, **kwargs):
        """A saved tokenizer; with no `vocabulary.txt` (saved before vocabularies), one without a vocabulary."""
        folder = Path(pretrained_model_name_or_path, subfolder or "")
        tokenizer = cls.from_config(cls.load_config(pretrained_model_name_or_path, subfolder=subfolder))
        found = folder / cls.vocabulary_name
        if found.is_file():  # words already normalised: read as written, not through words() again
            tokenizer.vocabulary = frozenset(found.read_text(encoding="utf-8").split("\n")) - {""}
        return tokenizer


def _units(word: str, min_n: int, max_n: int, max_ngrams: int) -> list[str]:
    w = f"<{word[:MAX_WORD_CHARS]}>"
    grams = [w[i : i + n] for n in range(min_n, max_n + 1) for i in range(len(w) - n + 1)]
    return [w] + [g for g in grams if g != w][: max_ngrams - 1]


@functools.lru_cache(maxsize=65536)
def _word_ids(word: str, num_buckets: int, min_n: int, max_n: int, max_ngrams: int) -> tuple[int, ...]:
    return tuple(fnv1a(u) % num_buckets for u in _units(word, min_n, max_n, max_ngrams))


class HashTextEncoder(ModelMixin, ConfigMixin):
    """Token ids (B, L, G) -> token vectors (B, L, hidden_size), zero at padding.

    Each word is the mean of its n-gram bucket embeddings plus a learned position, then a small pre-LN
    transformer (torch's nn.TransformerEncoder) lets the words of a prompt see each other ("red" in
    "red apple" vs "red heart"), then a LayerNorm.
    """

    @register_to_config
    def __init__(self, num_buckets: int = 16384, hidden_size: int = 256, num_layers: int = 2, num_heads: int = 4,
                 max_length: int = 32):
        super().__init__()
        if hidden_size % num_heads:
            raise ValueError(f"text encoder: hidden_size {hidden_size} must be divisible by num_heads {num_heads}")
        self.embed = nn.Embedding(num_buckets, hidden_size)
        self.position = nn.Embedding(max_length, hidden_size)
        layer = nn.TransformerEncoderLayer(hidden_size, num_heads, 4 * hidden_size, dropout=0.0, activation="gelu",
                                           batch_first=True, norm_first=True)
        self.layers = nn.TransformerEncoder(layer, num_layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(hidden_size)
        nn.init.normal_(self.embed.weight, std=0.02)
        nn.init.normal_(self.position.weight, std=0.02)

    def forward(self, input_ids: torch.Tensor, ngram_mask: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        m = ngram_mask.unsqueeze(-1).to(self.embed.weight.dtype)  # (B, L, G, 1)
        x = (self.embed(input_ids) * m).sum(2) / m.sum(2).clamp(min=1)  # (B, L, D): mean over each word's n-grams
        x = x + self.position.weight[: x.shape[1]]
        keep = attention_mask.bool()  # (B, L)
        # an all-padding row would give NaN attention: let it attend everywhere, its output is zeroed below
        pad = ~(keep | ~keep.any(1, keepdim=True))
        x = self.norm(self.layers(x, src_key_padding_mask=pad))
        return x * keep.unsqueeze(-1).to(x.dtype)  # (B, L, D)


def encode_prompts(tokenizer: WordHashTokenizer, text_encoder: HashTextEncoder, prompts: list[str],
                   device: torch.device | str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(states (B, L, D), mask (B, L) 1 = word) for the UNet's encoder_hidden_states / encoder_attention_mask."""
    tokens = tokenizer(prompts)
    device = device if device is not None else text_encoder.device
    tokens = {k: v.to(device) for k, v in tokens.items()}
    return text_encoder(**tokens), tokens["attention_mask"]


def prompts_from_file(path: str | os.PathLike, n: int) -> list[str]:
    """`n` prompts from a file of one per line (blank lines skipped), cycled: image k gets line k mod the count
    (`denoiser evaluate --prompts`, tools/gpu/finish.py: e.g. the held-out images' names, line k for image k)."""
    lines = [line.strip() for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]
    if not lines:
        raise ValueError(f"--prompts {path}: no prompts in it (one per line)")
    return [lines[k % len(lines)] for k in range(n)]


class PromptedUNet(nn.Module):
    """The UNet and its text encoder as one module for training: gradients reach the encoder through
    cross-attention, and Accelerate prepares, syncs and checkpoints the pair as one model."""

    def __init__(self, unet: nn.Module, text_encoder: HashTextEncoder):
        super().__init__()
        self.unet, self.text_encoder = unet, text_encoder

    def forward(self, sample: torch.Tensor, timestep: torch.Tensor, class_labels: torch.Tensor | None = None, *,
                input_ids: torch.Tensor, ngram_mask: torch.Tensor, attention_mask: torch.Tensor):
        states = self.text_encoder(input_ids, ngram_mask, attention_mask)  # (B, L, D)
        return self.unet(sample, timestep, class_labels=class_labels, encoder_hidden_states=states,
                         encoder_attention_mask=attention_mask.bool())  # bool: no value check (a GPU sync) per call

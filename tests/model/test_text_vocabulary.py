"""WordHashTokenizer's vocabulary: the words its model's training captions held, kept beside the config
(tokenizer/vocabulary.txt) so that `unseen` names the words of a prompt the model never saw."""

from __future__ import annotations

import pytest

from denoiser.model.text import WordHashTokenizer, words
from tests.conftest import ROOT

EMOJI = ROOT / "weights" / "emoji"


def test_unseen_reads_the_prompt_as_tokens_does():
    tok = WordHashTokenizer(num_buckets=64, vocabulary=["Red apple", "Café|heart", "keycap: #"])
    assert tok.vocabulary == {"red", "apple", "cafe", "|", "heart", "keycap", "#"}  # normalised by words()
    # accents, case and punctuation as the tokenizer reads them; each unseen word once, in prompt order
    assert tok.unseen("RED café, 日本 🍎 zorblax apple 日本 #!") == ["日本", "🍎", "zorblax"]
    assert tok.unseen("red apple") == [] and tok.unseen("") == []


def test_unseen_counts_only_the_words_that_reach_the_model():
    tok = WordHashTokenizer(num_buckets=64, max_length=2, vocabulary=["red"])
    assert tok.unseen("red red zorblax") == [] and tok.dropped("red red zorblax") == ["zorblax"]


def test_no_vocabulary_reports_nothing_unseen():
    assert WordHashTokenizer(num_buckets=64).unseen("日本 zorblax") == []
    assert WordHashTokenizer(num_buckets=64, vocabulary=[]).unseen("日本 zorblax") == ["日本", "zorblax"]


def test_a_string_is_not_a_vocabulary():
    with pytest.raises(TypeError, match="collection of texts"):
        WordHashTokenizer(vocabulary="red apple")


def test_the_vocabulary_round_trips_beside_the_config(tmp_path):
    tok = WordHashTokenizer(num_buckets=64, vocabulary=["red apple", "İstanbul", "keycap: #"])
    tok.save_pretrained(tmp_path)
    assert "vocabulary" not in (tmp_path / WordHashTokenizer.config_name).read_text()  # a file of its own
    assert (tmp_path / WordHashTokenizer.vocabulary_name).read_text(encoding="utf-8").splitlines() == sorted(tok.vocabulary)
    loaded = WordHashTokenizer.from_pretrained(tmp_path)
    assert loaded.vocabulary == tok.vocabulary and loaded.config.num_buckets == 64
    assert loaded.unseen("istanbul red # 日本") == tok.unseen("istanbul red # 日本") == words("日本")


def test_a_folder_saved_without_a_vocabulary_loads_without_one(tmp_path):
    WordHashTokenizer(num_buckets=64).save_pretrained(tmp_path)
    assert not (tmp_path / WordHashTokenizer.vocabulary_name).exists()
    loaded = WordHashTokenizer.from_pretrained(tmp_path)
    assert loaded.vocabulary is None and loaded.unseen("日本") == []


def test_the_emoji_model_knows_its_caption_words():
    tok = WordHashTokenizer.from_pretrained(EMOJI / "tokenizer")
    assert (EMOJI / "tokenizer" / WordHashTokenizer.vocabulary_name).stat().st_size < 64 * 1024
    assert tok.unseen("a red heart, a cat face and a japan flag") == []
    assert tok.unseen("日本 heart zorblaxian 🍎") == ["日本", "zorblaxian", "🍎"]


def test_the_emoji_models_example_prompts_use_only_its_caption_words():
    from denoiser.folders.model_dir import read_defaults

    tok = WordHashTokenizer.from_pretrained(EMOJI / "tokenizer")
    examples = read_defaults(EMOJI, None).example_prompts
    assert len(examples) >= 6 and all(tok.unseen(p) == [] for p in examples)

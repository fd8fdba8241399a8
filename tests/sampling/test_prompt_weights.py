"""Weighted prompts (denoiser/sampling/prompt_weights.py): A1111's syntax read into plain text and a weight per word, and the
errors that name the place in the prompt."""

from __future__ import annotations

import pytest

from denoiser.model.text import words
from denoiser.sampling.prompt_weights import BRACKET_WEIGHT, parse_prompt


@pytest.mark.parametrize("prompt, expected", [
    ("red apple", [("red", 1.0), ("apple", 1.0)]),
    ("(red:1.5) apple", [("red", 1.5), ("apple", 1.0)]),
    ("a (big red:0.5) car", [("a", 1.0), ("big", 0.5), ("red", 0.5), ("car", 1.0)]),
    ("(red) [apple]", [("red", BRACKET_WEIGHT), ("apple", 1 / BRACKET_WEIGHT)]),
    ("((red):2) apple", [("red", 2 * BRACKET_WEIGHT), ("apple", 1.0)]),
    ("(a (b:2):1.5) c", [("a", 1.5), ("b", 3.0), ("c", 1.0)]),
    ("(red : 1.5 )apple", [("red", 1.5), ("apple", 1.0)]),
    ("(red:0) apple", [("red", 0.0), ("apple", 1.0)]),
    ("(red:.5e1)", [("red", 5.0)]),
])
def test_weights_follow_a1111s_syntax(prompt, expected):
    p = parse_prompt(prompt)
    assert list(p.words) == [w for w, _ in expected]
    assert list(p.weights) == pytest.approx([x for _, x in expected])
    assert p.weighted == any(w != 1.0 for _, w in expected)


@pytest.mark.parametrize("prompt", ["red apple", "Red, apple!", "keycap: *", "a  b", ""])
def test_a_prompt_without_brackets_is_read_as_it_is(prompt):
    p = parse_prompt(prompt)
    assert p.words == tuple(words(prompt)) and words(p.text) == words(prompt) and not p.weighted


def test_escaped_brackets_are_characters_and_the_text_keeps_every_word():
    p = parse_prompt(r"a \(red\) apple (car:2)")
    assert p.words == ("a", "red", "apple", "car") and p.weights == (1.0, 1.0, 1.0, 2.0)
    assert words(p.text) == list(p.words)  # what the text encoder reads has the same words, in order
    assert "(" not in p.text and ":" not in p.text


@pytest.mark.parametrize("prompt, where, what", [
    ("(red:abc) apple", 6, "not a number"),
    ("(red apple", 1, "never closed"),
    ("red) apple", 4, "closes nothing"),
    ("[red) apple", 5, "brackets must nest"),
    ("(red:20) apple", 6, "outside 0..10"),
    ("(red:-1) apple", 6, "outside 0..10"),
    ("(:2) apple", 1, "weighs no words"),
])
def test_a_malformed_weight_names_its_place_and_the_fix(prompt, where, what):
    with pytest.raises(ValueError, match=rf"at character {where} of .*{what}"):
        parse_prompt(prompt)


def test_a_long_prompt_shows_the_part_around_the_mistake():
    prompt = "word " * 30 + "(oops:x)" + " more" * 10
    with pytest.raises(ValueError, match=r"near '.*\(oops:x\).*'") as err:
        parse_prompt(prompt)
    assert len(str(err.value)) < 300

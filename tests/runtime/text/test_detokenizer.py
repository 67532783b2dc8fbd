"""Incremental detokenization never splits a UTF-8 character; stop strings are cut from the text."""
import pytest

from actorserve.runtime.text.detokenizer import IncrementalDetokenizer


@pytest.fixture(scope="module")
def tokenizer(smollm):
    return smollm.get_tokenizer()


def test_multibyte_characters_arrive_whole(tokenizer):
    text = "naïve café — 日本語 😀 ok"
    ids = tokenizer.encode(text)
    detok = IncrementalDetokenizer(tokenizer, [])
    pieces = []
    for t in ids:
        detok.add(t)
        pieces.append(detok.take_new_text())
    assert "".join(pieces) == text
    assert all("\ufffd" not in p for p in pieces)
    assert len(ids) > len([p for p in pieces if p])  # some tokens were held back mid-character


def test_stop_string_across_tokens_is_removed(tokenizer):
    ids = tokenizer.encode("Hello there, general Kenobi. Goodbye")
    detok = IncrementalDetokenizer(tokenizer, ["general Ken"])
    hit = None
    for t in ids:
        hit = detok.add(t)
        if hit:
            break
    assert hit == "general Ken"
    assert detok.text == "Hello there, "


def test_include_stop_string(tokenizer):
    detok = IncrementalDetokenizer(tokenizer, ["there"], include_stop_str_in_output=True)
    for t in tokenizer.encode("Hello there, friend"):
        if detok.add(t):
            break
    assert detok.text == "Hello there"

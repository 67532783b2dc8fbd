"""A GGUF file's tokenizer is converted once and then loaded from a bounded cache, giving the same tokens."""
import os

import pytest

from actorserve.runtime.text import tokenizer as tok_module
from actorserve.runtime.model_files import resolve_model_path

TEXTS = ["The capital of France is", "  spaces\n\ttabs <|im_start|> émoji 🤖 ", ""]
CHAT = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ACTORSERVE_TOKENIZER_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def conversions(monkeypatch) -> list:
    import transformers

    calls = []
    original = transformers.AutoTokenizer.from_pretrained

    def counted(*args, **kwargs):
        if "gguf_file" in kwargs:
            calls.append(kwargs["gguf_file"])
        return original(*args, **kwargs)

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", counted)
    return calls


def same(a, b) -> None:
    for text in TEXTS:
        assert a.encode(text) == b.encode(text)
    ids = list(range(0, len(a), 97))
    assert a.decode(ids) == b.decode(ids)
    assert (a.eos_token_id, a.bos_token_id, a.pad_token_id) == (b.eos_token_id, b.bos_token_id, b.pad_token_id)
    assert a.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True) == \
        b.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True)


def test_converted_once_then_loaded_from_the_cache(cache, monkeypatch):
    calls = conversions(monkeypatch)
    path = resolve_model_path(None)
    first = tok_module.load_tokenizer(path)
    assert len(calls) == 1 and len(list(cache.iterdir())) == 1
    second = tok_module.load_tokenizer(path)
    assert len(calls) == 1  # no second conversion
    same(first, second)
    entry = next(cache.iterdir())
    (entry / "tokenizer.json").write_text("{ damaged")
    third = tok_module.load_tokenizer(path)  # a damaged entry: converted again and replaced
    assert len(calls) == 2
    same(first, third)
    tok_module.load_tokenizer(path)
    assert len(calls) == 2


def test_the_cache_is_bounded_and_keyed_by_the_file(cache, tmp_path):
    cache.mkdir()
    for i in range(tok_module.CACHE_ENTRIES + 3):
        (cache / f"old{i:02d}").mkdir()
        os.utime(cache / f"old{i:02d}", (i, i))
    copy = tmp_path / "copy.gguf"
    copy.write_bytes(open(resolve_model_path(None), "rb").read())
    key = tok_module._entry(str(copy))
    tok_module.load_tokenizer(str(copy))
    entries = sorted(p.name for p in cache.iterdir())
    assert len(entries) == tok_module.CACHE_ENTRIES and key.name in entries
    assert "old00" not in entries and f"old{tok_module.CACHE_ENTRIES + 2:02d}" in entries  # oldest went first
    os.utime(copy, (1, 1))  # the file changed: another key
    assert tok_module._entry(str(copy)) != key

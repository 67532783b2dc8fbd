"""The tokenizer of a model path: an HF directory's own, or the one a GGUF file describes.

Runs in every process that tokenizes or detokenizes (frontend, scheduler, offline engine). transformers
builds a GGUF file's tokenizer by parsing the file's metadata and converting its vocabulary and merges,
which is slow, and the frontend and the scheduler each do it at every start. The converted
tokenizer is therefore saved once (``save_pretrained``) in a small on-disk cache keyed by the file
(path, size, modification time) and the transformers and tokenizers versions, and later starts load that
instead. The cache holds a bounded number of entries, is written atomically (several processes may
convert the same file at once), and is only a shortcut: any failure falls back to the conversion.
"""
from __future__ import annotations

import hashlib
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Optional

from actorserve.runtime.config import tokenizer_cache_dir
from actorserve.runtime.errors import ModelLoadError
from actorserve.runtime.heap import trim_heap

log = logging.getLogger("actorserve")

CACHE_ENTRIES = 8  # converted tokenizers kept; the oldest goes first


def cache_dir() -> Path:
    return Path(tokenizer_cache_dir())


def load_tokenizer(path: str):
    from transformers import AutoTokenizer

    try:
        tokenizer = _gguf_tokenizer(path) if os.path.isfile(path) and path.endswith(".gguf") else \
            AutoTokenizer.from_pretrained(path)
    except Exception as exc:  # transformers raises many kinds here; the caller needs one
        raise ModelLoadError(f"could not load a tokenizer from {path}: {exc}") from exc
    trim_heap()  # the parse's scratch: most of what loading took
    return tokenizer


def _gguf_tokenizer(path: str):
    from transformers import AutoTokenizer

    entry = _entry(path)
    if entry is not None and (entry / "tokenizer_config.json").is_file():
        try:
            return AutoTokenizer.from_pretrained(str(entry))
        except Exception as exc:  # a damaged entry: convert again, and replace it
            log.warning("the cached tokenizer %s did not load (%s); converting the GGUF file again", entry, exc)
    tokenizer = AutoTokenizer.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path))
    if entry is not None:
        _store(tokenizer, entry)
    return tokenizer


def _entry(path: str) -> Optional[Path]:
    try:
        import tokenizers
        import transformers

        st = os.stat(path)
    except (OSError, ImportError):
        return None
    key = "\0".join([os.path.realpath(path), str(st.st_size), str(st.st_mtime_ns), transformers.__version__,
                     tokenizers.__version__])
    return cache_dir() / hashlib.sha256(key.encode()).hexdigest()[:24]


def _store(tokenizer, entry: Path) -> None:
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=entry.parent, prefix=".tmp-") as tmp:
            tokenizer.save_pretrained(tmp)
            shutil.rmtree(entry, ignore_errors=True)
            os.replace(tmp, entry)
            os.makedirs(tmp)  # for TemporaryDirectory's own clean-up
        _prune(entry.parent, keep=entry)
    except OSError as exc:
        log.info("could not cache the converted tokenizer in %s (%s)", entry, exc)


def _prune(root: Path, keep: Path) -> None:
    entries = sorted((p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")),
                     key=lambda p: p.stat().st_mtime, reverse=True)
    for old in [p for p in entries if p != keep][CACHE_ENTRIES - 1:]:
        shutil.rmtree(old, ignore_errors=True)


def max_token_chars(tokenizer) -> int:
    """The most characters any one token (special tokens included) stands for: the bound of the cheap
    length check before a prompt is tokenized."""
    return max((len(t) for t in tokenizer.get_vocab()), default=1)


TRIM_ABOVE_CHARS = 64 << 10


def encode(tokenizer, text: str, **kwargs) -> list[int]:
    """``tokenizer.encode``; after a long text, the allocator gives the tokenizer's scratch memory back
    to the system (glibc keeps freed memory in the thread's arena otherwise, so a refused giant prompt
    would leave the process bigger for good; bench/hostile.py measures it)."""
    ids = tokenizer.encode(text, **kwargs)
    if len(text) > TRIM_ABOVE_CHARS:
        trim_heap()
    return ids


def bad_words_token_ids(tokenizer, words: list[str], vocab_size: int) -> list[list[int]]:
    """Each bad word as the model would write it: its tokens alone and after a space (when a space
    tokenizes it differently, not merely with a space token first), as vLLM tokenizes bad_words."""
    out: list[list[int]] = []
    for word in words:
        plain = tokenizer.encode(word.lstrip(), add_special_tokens=False)
        spaced = tokenizer.encode(" " + word.lstrip(), add_special_tokens=False)
        out.append(plain)
        if spaced and spaced[0] != plain[0] and len(spaced) == len(plain):
            out.append(spaced)
    bad = sorted({t for ids in out for t in ids if not 0 <= t < vocab_size})
    if bad or not all(out):
        raise ValueError(f"bad_words: the tokenizer gives token ids {bad} outside the vocabulary [0, {vocab_size})")
    return out

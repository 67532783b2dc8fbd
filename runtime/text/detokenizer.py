"""Incremental detokenization and stop-string detection, one instance per sequence.

Text is emitted only up to the last complete character: a token that ends mid UTF-8 sequence decodes to
U+FFFD, so it is held back until the following tokens complete it. Stop strings are searched in the new
text plus enough of the old to catch one that spans a token boundary; the matched string and everything
after it are cut from the output.
"""
from __future__ import annotations

from typing import Optional, Protocol, Sequence

class Tokenizer(Protocol):
    def decode(self, ids: Sequence[int], skip_special_tokens: bool = ...) -> str: ...


class IncrementalDetokenizer:
    def __init__(self, tokenizer: Tokenizer, stop: Sequence[str], skip_special_tokens: bool = True,
                 include_stop_str_in_output: bool = False) -> None:
        self._tok = tokenizer
        self._skip = skip_special_tokens
        self._stop = list(stop)
        self._include_stop = include_stop_str_in_output
        self._ids: list[int] = []
        self._prefix_offset = 0
        self._read_offset = 0
        self.text = ""
        self._emitted = 0  # characters of self.text already handed out

    def add(self, token_id: int, check_stop: bool = True) -> Optional[str]:
        """Append a token; returns the stop string it completed, if any."""
        self._ids.append(token_id)
        prefix = self._decode(self._prefix_offset, self._read_offset)
        full = self._decode(self._prefix_offset, len(self._ids))
        if len(full) <= len(prefix) or full.endswith("\ufffd"):
            return None
        new = full[len(prefix):]
        old_len = len(self.text)
        self.text += new
        self._prefix_offset = self._read_offset
        self._read_offset = len(self._ids)
        return self._find_stop(old_len, len(new)) if check_stop else None

    def _decode(self, start: int, end: int) -> str:
        if start >= end:
            return ""
        return self._tok.decode(self._ids[start:end], skip_special_tokens=self._skip)

    def _find_stop(self, old_len: int, new_len: int) -> Optional[str]:
        for stop in self._stop:
            begin = max(0, old_len - len(stop) + 1)
            at = self.text.find(stop, begin)
            if at != -1:
                self.text = self.text[:at + len(stop)] if self._include_stop else self.text[:at]
                return stop
        return None

    def take_new_text(self, final: bool = False) -> str:
        """Text not handed out yet. While running, a tail that could begin a stop string is held back."""
        end = len(self.text)
        if not final and self._stop and not self._include_stop:
            end = max(self._emitted, end - max(len(s) for s in self._stop) + 1)
        out = self.text[self._emitted:end]
        self._emitted = end
        return out

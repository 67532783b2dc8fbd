"""What every tool-call parser shares: the call it finds, and the rules that keep a stream's view of the
text a prefix of the whole one.

A parser reads a model's whole answer so far (``scan``) and says which of it is content and which calls it
holds. While the answer is unfinished (``final`` False) it holds back anything that may still turn out to
be part of a call: a block that has opened and not closed, and a tail that may be the start of a call's
marker. So the content and calls a stream reports only ever grow, and end as the whole answer's.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Optional


@dataclass(frozen=True)
class ToolCall:
    """A call as the model wrote it: the function's name and its arguments as JSON text (a named
    tool_choice's grow while they are written)."""

    name: str
    arguments: str


@dataclass(frozen=True)
class Scan:
    content: str
    calls: tuple[ToolCall, ...] = ()


class ToolParser:
    """One model family's tool-call format. ``tools``: the request's tools as OpenAI writes them (a format
    whose arguments are untyped text reads their types from the schemas)."""

    name: ClassVar[str]
    needs_special_tokens: ClassVar[bool] = False  # its markers are special tokens, kept in the text

    def __init__(self, tools: Optional[list[dict]] = None) -> None:
        self.tools = tools or []

    def scan(self, text: str, final: bool) -> Scan:
        raise NotImplementedError


def held_back(text: str, markers: tuple[str, ...]) -> str:
    """``text`` less a tail that may be the start of one of ``markers`` (which more text would complete)."""
    for size in range(min(len(text), max(map(len, markers)) - 1), 0, -1):
        tail = text[-size:]
        if any(m.startswith(tail) for m in markers):
            return text[:-size]
    return text


def scan_blocks(text: str, final: bool, start: str, end: str,
                parse: Callable[[str], Optional[list[ToolCall]]]) -> Scan:
    """Calls written as blocks between ``start`` and ``end``, anywhere in the text; the text outside them is
    the content, and a block that does not parse stays in it as written. A block left open at the end is
    content too (the answer was cut short)."""
    content, calls, pos = [], [], 0
    while True:
        i = text.find(start, pos)
        if i < 0:
            content.append(text[pos:] if final else held_back(text[pos:], (start,)))
            break
        content.append(text[pos:i])
        j = text.find(end, i + len(start))
        if j < 0:
            if final:
                content.append(text[i:])
            break
        found = parse(text[i + len(start):j])
        if found is None:
            content.append(text[i:j + len(end)])
        else:
            calls.extend(found)
        pos = j + len(end)
    return Scan("".join(content), tuple(calls))


def json_call(body: Any, arguments_keys: tuple[str, ...] = ("arguments", "parameters")) -> Optional[ToolCall]:
    """``{"name": ..., "arguments": {...}}`` (or the other key), or None where it is not that shape."""
    if not isinstance(body, dict) or not isinstance(body.get("name"), str):
        return None
    args = next((body[k] for k in arguments_keys if k in body), {})
    if isinstance(args, str):  # some models write the arguments as JSON text
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            return None
    if not isinstance(args, dict):
        return None
    return ToolCall(body["name"], json.dumps(args, ensure_ascii=False))


def decode_json(text: str, pos: int = 0) -> tuple[Any, int]:
    """The JSON value at ``pos`` (after whitespace) and where it ends; ValueError where there is none yet."""
    decoder = json.JSONDecoder()
    while pos < len(text) and text[pos].isspace():
        pos += 1
    return decoder.raw_decode(text, pos)

"""``mistral``: the calls follow ``[TOOL_CALLS]``, the text before it is the content. Two shapes, by the
tokenizer's version: a JSON list, ``[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]`` (Mistral 7B
v0.3, Mistral Nemo, Small 3.1), or one call after each marker, ``[TOOL_CALLS]name[ARGS]{...}`` (version
11 on: Mistral Small 3.2, Magistral, Devstral), where ``[CALL_ID]id`` may precede ``[ARGS]``."""
from __future__ import annotations

import json
import re

from actorserve.runtime.text.tool_parsers.base import (Scan, ToolCall, ToolParser, decode_json, held_back,
                                                       json_call)

MARKER = "[TOOL_CALLS]"
_NAMED = re.compile(r"\s*([A-Za-z_][\w.\-]*)(?:\[CALL_ID\][^\[]*)?\[ARGS\]")


class MistralParser(ToolParser):
    name = "mistral"
    needs_special_tokens = True

    def scan(self, text: str, final: bool) -> Scan:
        i = text.find(MARKER)
        if i < 0:
            return Scan(text if final else held_back(text, (MARKER,)))
        calls, pos = [], i
        while text.startswith(MARKER, pos):
            found, end = _calls_at(text, pos + len(MARKER))
            if not found:
                break
            calls.extend(found)
            pos = len(text) - len(text[end:].lstrip())
        if final:
            return Scan(text[:i] + text[pos:], tuple(calls))
        return Scan(text[:i], tuple(calls))  # the rest may be a call still being written


def _calls_at(text: str, pos: int) -> tuple[list[ToolCall], int]:
    named = _NAMED.match(text, pos)
    try:
        if named:
            args, end = decode_json(text, named.end())
            return ([ToolCall(named.group(1), json.dumps(args, ensure_ascii=False))]
                    if isinstance(args, dict) else []), end
        body, end = decode_json(text, pos)
    except ValueError:
        return [], pos
    calls = [json_call(c) for c in (body if isinstance(body, list) else [body])]
    return ([] if any(c is None for c in calls) else calls), end

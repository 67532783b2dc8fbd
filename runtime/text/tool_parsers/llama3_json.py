"""``llama3_json`` (Llama 3.1, 3.2 and 3.3, JSON-based tool calling): the answer is a call,
``{"name": ..., "parameters": {...}}``, optionally after ``<|python_tag|>``; several are separated by
``;``. An answer that starts otherwise is content; so is what follows the last call that parses."""
from __future__ import annotations

from actorserve.runtime.text.tool_parsers.base import Scan, ToolParser, decode_json, json_call

PYTHON_TAG = "<|python_tag|>"


class Llama3JsonParser(ToolParser):
    name = "llama3_json"
    needs_special_tokens = True

    def scan(self, text: str, final: bool) -> Scan:
        head = text.lstrip()
        if not final and PYTHON_TAG.startswith(head):
            return Scan("")  # it may yet be a call
        if head.startswith(PYTHON_TAG):
            head = head[len(PYTHON_TAG):]
        elif not head.startswith("{"):
            return Scan(text)
        calls, pos = [], 0
        while True:
            try:
                body, end = decode_json(head, pos)
            except ValueError:
                break
            call = json_call(body)
            if call is None:
                break
            calls.append(call)
            rest = head[end:].lstrip()
            pos = len(head) - len(rest) + (1 if rest.startswith(";") else 0)
            if not rest.startswith(";"):
                break
        if not final:
            return Scan("", tuple(calls))  # what follows may be another call
        return Scan(head[pos:] if calls else text, tuple(calls))

"""``pythonic`` (Llama 3.2 and 4, ToolACE): the answer is a Python list of calls with keyword arguments,
``[get_weather(city='Paris', unit="celsius"), get_time(city='Tokyo')]``, Llama 4's between
``<|python_start|>`` and ``<|python_end|>``. The values are Python literals. Only a whole answer of that
shape is calls (read once it is finished); any other is content."""
from __future__ import annotations

import ast
import json
from typing import Optional

from actorserve.runtime.text.tool_parsers.base import Scan, ToolCall, ToolParser

START, END = "<|python_start|>", "<|python_end|>"


class PythonicParser(ToolParser):
    name = "pythonic"

    def scan(self, text: str, final: bool) -> Scan:
        head = text.strip()
        if not final:
            maybe = head.startswith(("[", START)) or START.startswith(head)
            return Scan("" if maybe else text)
        calls = _calls(head.removeprefix(START).removesuffix(END).strip())
        return Scan(text) if calls is None else Scan("", tuple(calls))


def _calls(text: str) -> Optional[list[ToolCall]]:
    try:
        tree = ast.parse(text, mode="eval").body
    except (SyntaxError, ValueError):
        return None
    if not isinstance(tree, ast.List) or not tree.elts:
        return None
    calls = []
    for node in tree.elts:
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name) or node.args:
            return None
        try:
            args = {kw.arg: ast.literal_eval(kw.value) for kw in node.keywords if kw.arg is not None}
            arguments = json.dumps(args, ensure_ascii=False)
        except (ValueError, TypeError, SyntaxError):
            return None
        calls.append(ToolCall(node.func.id, arguments))
    return calls

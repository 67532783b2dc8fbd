"""``deepseek_v3`` (DeepSeek-V3, R1-0528): the calls sit between ``<｜tool▁calls▁begin｜>`` and
``<｜tool▁calls▁end｜>``, each one::

    <｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather
    ```json
    {"city": "Paris"}
    ```<｜tool▁call▁end｜>

The text before the calls is the content (and any after them)."""
from __future__ import annotations

import json
import re
from typing import Optional

from actorserve.runtime.text.tool_parsers.base import Scan, ToolCall, ToolParser, held_back, scan_blocks

CALLS_BEGIN, CALLS_END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
CALL_BEGIN, CALL_END = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>"
_CALL = re.compile(r"\s*(?:\w+)<｜tool▁sep｜>([^\n]+)\n```(?:json)?\n(.*)\n```\s*\Z", re.S)


class DeepSeekV3Parser(ToolParser):
    name = "deepseek_v3"
    needs_special_tokens = True

    def scan(self, text: str, final: bool) -> Scan:
        i = text.find(CALLS_BEGIN)
        if i < 0:
            return Scan(text if final else held_back(text, (CALLS_BEGIN,)))
        j = text.find(CALLS_END, i)
        inner = text[i + len(CALLS_BEGIN):] if j < 0 else text[i + len(CALLS_BEGIN):j]
        found = scan_blocks(inner, final or j >= 0, CALL_BEGIN, CALL_END, _call)
        if not final:
            return Scan(text[:i], found.calls)  # the calls, then maybe more text: held until the end
        after = "" if j < 0 else text[j + len(CALLS_END):]
        if not found.calls:
            return Scan(text)
        return Scan(text[:i] + found.content.strip() + after, found.calls)


def _call(body: str) -> Optional[list[ToolCall]]:
    match = _CALL.match(body)
    if match is None:
        return None
    try:
        args = json.loads(match.group(2))
    except json.JSONDecodeError:
        return None
    return [ToolCall(match.group(1).strip(), json.dumps(args, ensure_ascii=False))] if isinstance(args, dict) else None

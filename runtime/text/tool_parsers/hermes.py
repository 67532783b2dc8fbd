"""``hermes`` (Hermes 2 Pro and 3, Qwen 2.5 and Qwen 3): each call is
``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, anywhere in the answer."""
from __future__ import annotations

import json
from typing import Optional

from actorserve.runtime.text.tool_parsers.base import Scan, ToolCall, ToolParser, json_call, scan_blocks


class HermesParser(ToolParser):
    name = "hermes"

    def scan(self, text: str, final: bool) -> Scan:
        return scan_blocks(text, final, "<tool_call>", "</tool_call>", _call)


def _call(body: str) -> Optional[list[ToolCall]]:
    try:
        call = json_call(json.loads(body))
    except json.JSONDecodeError:
        return None
    return None if call is None else [call]

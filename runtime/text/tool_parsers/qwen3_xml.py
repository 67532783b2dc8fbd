"""``qwen3_xml`` (also ``qwen3_coder``: Qwen3-Coder, Qwen3-Next, Qwen3.5): each call is a block of XML-like
tags, the values untyped text, read by the types the tool's schema gives its parameters::

    <tool_call>
    <function=get_weather>
    <parameter=city>
    Paris
    </parameter>
    </function>
    </tool_call>
"""
from __future__ import annotations

import ast
import json
import re
from typing import Any, Optional

from actorserve.runtime.text.tool_parsers.base import Scan, ToolCall, ToolParser, scan_blocks

_FUNCTION = re.compile(r"\s*<function=([^>\n]+)>(.*?)</function>\s*\Z", re.S)
_PARAMETER = re.compile(r"<parameter=([^>\n]+)>(.*?)(?:</parameter>|(?=<parameter=)|\Z)", re.S)


class Qwen3XmlParser(ToolParser):
    name = "qwen3_xml"

    def scan(self, text: str, final: bool) -> Scan:
        return scan_blocks(text, final, "<tool_call>", "</tool_call>", self._call)

    def _call(self, body: str) -> Optional[list[ToolCall]]:
        function = _FUNCTION.match(body)
        if function is None:
            return None
        name = function.group(1).strip()
        types = self._types(name)
        args = {}
        for found in _PARAMETER.finditer(function.group(2)):
            key = found.group(1).strip()
            args[key] = _typed(found.group(2).removeprefix("\n").removesuffix("\n"), types.get(key))
        return [ToolCall(name, json.dumps(args, ensure_ascii=False))]

    def _types(self, name: str) -> dict[str, Any]:
        for tool in self.tools:
            function = tool.get("function") or {}
            if function.get("name") == name:
                properties = (function.get("parameters") or {}).get("properties") or {}
                return {k: (v or {}).get("type") for k, v in properties.items() if isinstance(v, dict)}
        return {}


def _typed(value: str, kind: Any) -> Any:
    """The value as the schema's type reads it; text where it does not read so (or the type is unknown)."""
    kinds = kind if isinstance(kind, list) else [kind]
    if value.strip().lower() == "null" and ("null" in kinds or kind is None):
        return None
    for k in kinds:
        try:
            if k == "integer":
                return int(value.strip())
            if k == "number":
                number = float(value.strip())
                return int(number) if number.is_integer() and "." not in value and "e" not in value.lower() else number
            if k == "boolean" and value.strip().lower() in ("true", "false"):
                return value.strip().lower() == "true"
            if k in ("object", "array"):
                try:
                    return json.loads(value)
                except json.JSONDecodeError:
                    return ast.literal_eval(value.strip())
        except (ValueError, SyntaxError):
            continue
    return value


class Qwen3CoderParser(Qwen3XmlParser):
    name = "qwen3_coder"

"""Tool calling on chat completions, as vLLM serves it.

- ``tool_choice`` "none": the tools are shown to the template, and no call is made.
- A named function (``{"type": "function", "function": {"name": ...}}``): the output is constrained to that
  function's parameters schema (structured outputs), so the arguments always parse; the answer is one
  call with the output as its arguments (finish_reason "stop", as vLLM).
- "required": the output is constrained to a JSON array of ``{"name": ..., "parameters": {...}}`` objects,
  each one of the tools with its own schema, at least one; each is a call (finish_reason "tool_calls").
- "auto" (also tools without tool_choice, OpenAI's default): needs ``--enable-auto-tool-choice`` and a
  ``--tool-call-parser``; the model answers freely and the parser finds its calls. ``hermes``: each call
  is ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, the text before the first is the
  content. A block that does not parse stays in the content.
"""
from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Any, Optional

PARSERS = ("hermes",)
_HERMES = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.S)


@dataclass(frozen=True)
class ToolMode:
    """How a request's tool calls are made: ``kind`` is "named", "required" or "auto"."""

    kind: str
    name: Optional[str] = None  # the named function's
    parser: Optional[str] = None  # auto's


def mode_of(request, auto_parser: Optional[str]) -> Optional[ToolMode]:
    """The request's tool mode, or None (no tools, or tool_choice "none"); ValueError (a 400) where it
    asks for what this server cannot do."""
    choice = request.tool_choice
    if not request.tools or choice == "none":
        if choice not in (None, "none"):
            raise ValueError(f"tool_choice {_shown(choice)} needs tools")
        return None
    if choice is None or choice == "auto":
        if auto_parser is None:
            raise ValueError('"auto" tool choice (also tools without tool_choice) requires '
                             "--enable-auto-tool-choice and --tool-call-parser to be set")
        return ToolMode("auto", parser=auto_parser)
    if choice == "required":
        return ToolMode("required")
    name = choice.function.name
    if name not in {t.function.name for t in request.tools}:
        raise ValueError(f"tool_choice names the function {name!r}, which is not among the tools")
    return ToolMode("named", name=name)


def constraint(request, mode: Optional[ToolMode]) -> Optional[dict[str, Any]]:
    """The structured outputs (StructuredOutputsParams' fields) that make the output a valid call."""
    if mode is None or mode.kind == "auto":
        return None
    tools = {t.function.name: _parameters(t) for t in request.tools}
    if mode.kind == "named":
        return {"json": tools[mode.name]}
    items = [{"type": "object", "properties": {"name": {"type": "string", "enum": [name]}, "parameters": schema},
              "required": ["name", "parameters"]} for name, schema in tools.items()]
    return {"json": {"type": "array", "minItems": 1, "items": {"anyOf": items}}}


def calls_of(text: str, mode: ToolMode) -> tuple[Optional[str], list[dict]]:
    """(content, tool_calls in OpenAI's shape) of a finished output."""
    if mode.kind == "named":
        return None, [_call(mode.name, text)]
    if mode.kind == "required":
        try:
            calls = json.loads(text)
        except json.JSONDecodeError:  # cut short by max_tokens: the text is all there is
            return text, []
        return None, [_call(c["name"], json.dumps(c.get("parameters", {}))) for c in calls]
    calls, kept = [], []
    for found in _HERMES.finditer(text):
        try:
            body = json.loads(found.group(1))
            calls.append(_call(str(body["name"]), json.dumps(body.get("arguments", {}))))
        except (json.JSONDecodeError, KeyError, TypeError):
            kept.append(found.group(0))
    first = text.find("<tool_call>") if calls else -1
    content = (text if first < 0 else text[:first]).strip() + "".join(kept)
    return (content or None) if calls else text, calls


def finish_reason(mode: ToolMode, reason: Optional[str], calls: list[dict]) -> Optional[str]:
    """vLLM's: "tool_calls" where calls were made by "required" or found by the parser."""
    if calls and reason == "stop" and mode.kind in ("required", "auto"):
        return "tool_calls"
    return reason


def call_id() -> str:
    return f"chatcmpl-tool-{uuid.uuid4().hex}"


def _call(name: str, arguments: str) -> dict:
    return {"id": call_id(), "type": "function", "function": {"name": name, "arguments": arguments}}


def _parameters(tool) -> dict:
    return tool.function.parameters or {"type": "object", "properties": {}}


def _shown(choice) -> str:
    return repr(choice) if isinstance(choice, str) else repr(choice.function.name)

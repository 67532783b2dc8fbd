"""Tool calling on chat completions, as vLLM serves it.

- ``tool_choice`` "none": the tools are shown to the template, and no call is made.
- A named function (``{"type": "function", "function": {"name": ...}}``): the output is constrained to that
  function's parameters schema (structured outputs), so the arguments always parse; the answer is one
  call with the output as its arguments (finish_reason "stop", as vLLM).
- "required": the output is constrained to a JSON array of ``{"name": ..., "parameters": {...}}`` objects,
  each one of the tools with its own schema, at least one; each is a call (finish_reason "tool_calls").
- "auto" (also tools without tool_choice, OpenAI's default): needs ``--enable-auto-tool-choice`` and a
  ``--tool-call-parser`` (``runtime.text.tool_parsers``); the model answers freely and the parser finds
  its calls. A call that does not parse stays in the content.

Each mode reads the answer with a ``ToolParser``, so chat, Responses and Messages stream calls alike.
"""
from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any, Optional

from actorserve.runtime.text.tool_parsers import TOOL_PARSERS, Scan, ToolCall, ToolParser

PARSERS = tuple(TOOL_PARSERS)


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


def parser_of(mode: Optional[ToolMode], tools: Optional[list[dict]]) -> Optional[ToolParser]:
    """The parser that reads the mode's calls from the answer; None without tools."""
    if mode is None:
        return None
    if mode.kind == "named":
        return _NamedCall(mode.name)
    if mode.kind == "required":
        return _RequiredCalls()
    return TOOL_PARSERS[mode.parser](tools)


class _NamedCall(ToolParser):
    """The whole answer is the named function's arguments (the grammar saw to it), streamed as they come."""

    name = "named"

    def __init__(self, function: str) -> None:
        super().__init__()
        self.function = function

    def scan(self, text: str, final: bool) -> Scan:
        if not text and not final:
            return Scan("")
        return Scan("", (ToolCall(self.function, text),))


class _RequiredCalls(ToolParser):
    """The answer is a JSON list of ``{"name", "parameters"}``, read once whole; cut short, it is content."""

    name = "required"

    def scan(self, text: str, final: bool) -> Scan:
        if not final:
            return Scan("")
        try:
            calls = json.loads(text)
            return Scan("", tuple(ToolCall(c["name"], json.dumps(c.get("parameters", {}))) for c in calls))
        except (json.JSONDecodeError, KeyError, TypeError):
            return Scan(text)


def finish_reason(mode: Optional[ToolMode], reason: Optional[str], calls) -> Optional[str]:
    """vLLM's: "tool_calls" wherever calls were made by "required" or found by the parser (an answer
    that ran on to max_tokens after its call included)."""
    if calls and reason in ("stop", "length") and mode is not None and mode.kind in ("required", "auto"):
        return "tool_calls"
    return reason


def call_id() -> str:
    return f"chatcmpl-tool-{uuid.uuid4().hex}"


def call_json(call: ToolCall) -> dict:
    """A call in chat's shape, with a new id."""
    return {"id": call_id(), "type": "function", "function": {"name": call.name, "arguments": call.arguments}}


def _parameters(tool) -> dict:
    return tool.function.parameters or {"type": "object", "properties": {}}


def _shown(choice) -> str:
    return repr(choice) if isinstance(choice, str) else repr(choice.function.name)

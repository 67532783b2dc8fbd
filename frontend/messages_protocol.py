"""Anthropic's Messages API request (``POST /v1/messages``, ``/v1/messages/count_tokens``), and its reading
as a chat request.

Runs in the frontend process. As for Responses, a Messages request is served as the chat request it
amounts to (``chat_body``): ``system`` becomes the system message, ``tool_use`` blocks an assistant's tool
calls, ``tool_result`` blocks tool messages, ``thinking`` blocks (the model's own notes) are not shown to
it again; ``tool_choice`` any is chat's "required", tool is a named function. An image or document
block, a server tool, and a field that would change the output and is not served are each a 400.
"""
from __future__ import annotations

import json
from typing import Annotated, Any, Literal, Optional, Union

from pydantic import ConfigDict, Field, StrictBool, StrictInt

from actorserve.frontend.errors import APIError
from actorserve.frontend.foreign_requests import check_extra, sampling_extras, string_field, text_of
from actorserve.frontend.protocol import MAX_MESSAGES, MAX_TOOLS, Text, _Schema

UNSUPPORTED: dict[str, tuple] = {"container": (None,), "mcp_servers": (None, []), "context_management": (None,)}
ACCEPTED_UNUSED = frozenset({"service_tier", "anthropic_version", "cache_control", "diagnostics", "inference_geo",
                             "speed", "user_profile_id", "workspace_id"})


class AnthropicMessage(_Schema):
    role: Literal["user", "assistant"]
    content: Union[Text, Annotated[list[dict[str, Any]], Field(max_length=MAX_MESSAGES)]]


class MessagesRequest(_Schema):
    model_config = ConfigDict(extra="allow", allow_inf_nan=False)

    model: Text
    messages: list[AnthropicMessage] = Field(min_length=1, max_length=MAX_MESSAGES)
    system: Optional[Union[Text, list[dict[str, Any]]]] = None
    max_tokens: StrictInt
    stop_sequences: Optional[list[Text]] = None
    temperature: Optional[float] = None
    top_p: Optional[float] = None
    top_k: Optional[StrictInt] = None
    tools: Optional[list[dict[str, Any]]] = Field(None, max_length=MAX_TOOLS)
    tool_choice: Optional[dict[str, Any]] = None
    thinking: Optional[dict[str, Any]] = None
    output_config: Optional[dict[str, Any]] = None  # format (a JSON schema for the answer) and effort
    metadata: Optional[dict[str, Any]] = None
    stream: StrictBool = False

    def check_fields(self) -> list[str]:
        return check_extra(self.model_extra or {}, UNSUPPORTED, ACCEPTED_UNUSED)

    def chat_body(self) -> dict:
        body: dict[str, Any] = {"model": self.model, "messages": self.chat_messages(), "max_tokens": self.max_tokens,
                                "stream": self.stream}
        for ours, theirs in (("temperature", "temperature"), ("top_p", "top_p"), ("top_k", "top_k"),
                             ("stop", "stop_sequences")):
            if getattr(self, theirs) is not None:
                body[ours] = getattr(self, theirs)
        body.update(sampling_extras(self.model_extra or {}))
        if self.tools:
            body["tools"] = [_tool(t, i) for i, t in enumerate(self.tools)]
        choice = _tool_choice(self.tool_choice) if self.tool_choice is not None else None
        if choice is not None and self.tools:
            body["tool_choice"] = choice
        if self.thinking is not None:
            body["chat_template_kwargs"] = {"enable_thinking": self.thinking.get("type") != "disabled"}
        config = self.output_config or {}
        if config.get("effort") in ("low", "medium", "high"):
            body["reasoning_effort"] = config["effort"]
        fmt = config.get("format")
        if fmt is not None:
            if not isinstance(fmt, dict) or fmt.get("type") != "json_schema":
                raise APIError(400, "output_config.format: only a json_schema format is served", "output_config")
            body["response_format"] = {"type": "json_schema", "json_schema": {"name": "output",
                                                                              "schema": fmt.get("schema")}}
        return body

    def chat_messages(self) -> list[dict]:
        messages = []
        if self.system is not None:
            messages.append({"role": "system", "content": self.system if isinstance(self.system, str)
                             else text_of(self.system, ("text",), "system", "system")})
        for i, m in enumerate(self.messages):
            messages.extend(_chat_messages(m, f"messages[{i}]"))
        return messages


def _chat_messages(m: AnthropicMessage, where: str) -> list[dict]:
    if isinstance(m.content, str):
        return [{"role": m.role, "content": m.content}]
    text, calls, results = [], [], []
    for j, block in enumerate(m.content):
        kind = block.get("type")
        if kind == "text":
            text.append(string_field(block, "text", f"{where}.content[{j}]", "messages"))
        elif kind == "tool_use" and m.role == "assistant":
            calls.append({"id": string_field(block, "id", where, "messages"), "type": "function",
                          "function": {"name": string_field(block, "name", where, "messages"),
                                       "arguments": json.dumps(block.get("input") or {})}})
        elif kind == "tool_result" and m.role == "user":
            content = block.get("content", "")
            results.append({"role": "tool", "tool_call_id": string_field(block, "tool_use_id", where, "messages"),
                            "content": text_of(content, ("text",), where, "messages")})
        elif kind not in ("thinking", "redacted_thinking"):
            raise APIError(400, f"{where}.content[{j}]: blocks of type {kind!r} are not supported here"
                                + (": the served model takes text only" if kind in ("image", "document") else ""),
                           "messages")
    if m.role == "assistant":
        message: dict = {"role": "assistant", "content": "".join(text) or None}
        if calls:
            message["tool_calls"] = calls
        return [message]
    return results + ([{"role": "user", "content": "".join(text)}] if text or not results else [])


def _tool(tool: dict, i: int) -> dict:
    if tool.get("type") not in (None, "custom") or not isinstance(tool.get("name"), str):
        raise APIError(400, f"tools[{i}]: the server tool {tool.get('type')!r} is not served by this server; only "
                            "custom tools (name, description, input_schema) are", "tools")
    function = {"name": tool["name"], "parameters": tool.get("input_schema") or {"type": "object"}}
    if tool.get("description") is not None:
        function["description"] = tool["description"]
    return {"type": "function", "function": function}


def _tool_choice(choice: dict) -> Optional[Union[str, dict]]:
    kind = choice.get("type")
    if kind == "tool" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
    named = {"auto": "auto", "any": "required", "none": "none"}
    if kind not in named:
        raise APIError(400, f"tool_choice type {kind!r} is not supported: give auto, any, tool or none", "tool_choice")
    return named[kind]


class CountTokensRequest(MessagesRequest):
    """``/v1/messages/count_tokens``: the request's prompt, counted; it needs no ``max_tokens``."""

    max_tokens: Optional[StrictInt] = None

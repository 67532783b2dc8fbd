"""The Responses API's request (``POST /v1/responses``), and its reading as a chat request.

Runs in the frontend process. A Responses request is served as the chat request it amounts to (the same
template, sampling parameters, structured outputs and tool modes): ``chat_body`` writes it, so nothing of
chat is implemented twice. The input's items become chat messages: a message (text parts only), a
function call (an assistant message's tool call) and its output (a tool message); reasoning items are
the model's own notes and are not shown to it again, as vLLM does. A built-in tool, a content part that
is not text, and a field that would change the output and is not served are each a 400 naming them.
"""
from __future__ import annotations

import json
from typing import Annotated, Any, Literal, Optional, Union

from pydantic import ConfigDict, Field, StrictBool, StrictInt

from actorserve.frontend.errors import APIError
from actorserve.frontend.foreign_requests import check_extra, sampling_extras, string_field, text_of
from actorserve.frontend.protocol import MAX_MESSAGES, MAX_TOOLS, Text, _Schema

# fields of OpenAI's body that would change the output, not served, with the values that change nothing
UNSUPPORTED: dict[str, tuple] = {
    "prompt": (None,), "conversation": (None,), "max_tool_calls": (None,), "top_logprobs": (None, 0),
    "truncation": (None, "disabled"), "context_management": (None,),
}
ACCEPTED_UNUSED = frozenset({"include", "user", "service_tier", "prompt_cache_key", "prompt_cache_retention",
                             "prompt_cache_options", "safety_identifier", "stream_options", "request_id"})
_TEXT_PARTS = ("input_text", "output_text", "text", "summary_text", "reasoning_text")


class ResponsesRequest(_Schema):
    model_config = ConfigDict(extra="allow", allow_inf_nan=False)

    model: Optional[Text] = None
    input: Union[Text, Annotated[list[dict[str, Any]], Field(max_length=MAX_MESSAGES)]]
    instructions: Optional[Text] = None
    tools: Optional[list[dict[str, Any]]] = Field(None, max_length=MAX_TOOLS)
    tool_choice: Optional[Union[Literal["none", "auto", "required"], dict[str, Any]]] = None
    text: Optional[dict[str, Any]] = None
    max_output_tokens: Optional[StrictInt] = None
    temperature: Optional[float] = None
    top_p: Optional[float] = None
    top_k: Optional[StrictInt] = None
    seed: Optional[StrictInt] = None
    stop: Optional[Union[Text, list[Text]]] = None
    reasoning: Optional[dict[str, Any]] = None
    metadata: Optional[dict[str, Text]] = None
    parallel_tool_calls: Optional[StrictBool] = None
    stream: StrictBool = False
    store: StrictBool = True
    background: StrictBool = False
    previous_response_id: Optional[Text] = None

    def check_fields(self) -> list[str]:
        """A 400 for the first field asking for what is not served; the unknown fields' names, for a warning."""
        if self.background and not self.store:
            raise APIError(400, "background responses need store to be true", "background")
        return check_extra(self.model_extra or {}, UNSUPPORTED, ACCEPTED_UNUSED)

    def chat_body(self, history: list[dict]) -> dict:
        """The chat request this one amounts to, after ``history`` (a previous response's conversation)."""
        messages = ([{"role": "system", "content": self.instructions}] if self.instructions else []) + history
        messages += self.messages()
        body: dict[str, Any] = {"model": self.model, "messages": messages, "max_tokens": self.max_output_tokens,
                                "stream": self.stream}
        for name in ("temperature", "top_p", "top_k", "seed", "stop"):
            if getattr(self, name) is not None:
                body[name] = getattr(self, name)
        body.update(sampling_extras(self.model_extra or {}))
        effort = (self.reasoning or {}).get("effort")
        if effort in ("low", "medium", "high"):
            body["reasoning_effort"] = effort
        if self.tools:
            body["tools"] = [_function_tool(t, i) for i, t in enumerate(self.tools)]
        if self.tool_choice is not None:
            body["tool_choice"] = _tool_choice(self.tool_choice)
        fmt = (self.text or {}).get("format")
        if fmt is not None:
            body["response_format"] = _response_format(fmt)
        return body

    def messages(self) -> list[dict]:
        """The input as chat messages."""
        if isinstance(self.input, str):
            return [{"role": "user", "content": self.input}]
        messages: list[dict] = []
        for i, item in enumerate(self.input):
            _add_item(messages, item, f"input[{i}]")
        return messages


def _add_item(messages: list[dict], item: dict, where: str) -> None:
    kind = item.get("type", "message")
    if kind == "message":
        role = item.get("role")
        if role not in ("user", "system", "developer", "assistant"):
            raise APIError(400, f"{where}.role must be one of user, system, developer and assistant", "input")
        messages.append({"role": role, "content": text_of(item.get("content"), _TEXT_PARTS, where, "input")})
    elif kind == "function_call":
        name, arguments = (string_field(item, key, where, "input") for key in ("name", "arguments"))
        call = {"id": string_field(item, "call_id", where, "input"), "type": "function",
                "function": {"name": name, "arguments": arguments}}
        last = messages[-1] if messages else None
        if last is not None and last["role"] == "assistant":
            last.setdefault("tool_calls", []).append(call)  # one assistant turn: its text and its calls
        else:
            messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
    elif kind == "function_call_output":
        output = item.get("output")
        messages.append({"role": "tool", "tool_call_id": string_field(item, "call_id", where, "input"),
                         "content": text_of(output, _TEXT_PARTS, where, "input")})
    elif kind != "reasoning":
        raise APIError(400, f"{where}: input items of type {kind!r} are not supported by this server", "input")


def _function_tool(tool: dict, i: int) -> dict:
    if tool.get("type") != "function":
        raise APIError(400, f"tools[{i}]: the built-in tool {tool.get('type')!r} is not served by this server; "
                            "only function tools are", "tools")
    return {"type": "function", "function": {k: tool[k] for k in ("name", "description", "parameters")
                                             if tool.get(k) is not None}}


def _tool_choice(choice: Union[str, dict]) -> Union[str, dict]:
    if isinstance(choice, str):
        return choice
    if choice.get("type") == "function" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
    raise APIError(400, f"tool_choice {json.dumps(choice)[:100]} is not supported by this server: give none, auto, "
                        "required or a function", "tool_choice")


def _response_format(fmt: dict) -> dict:
    kind = fmt.get("type")
    if kind == "json_schema":
        return {"type": "json_schema", "json_schema": {"name": fmt.get("name", "response"), "schema": fmt.get("schema"),
                                                       "strict": fmt.get("strict")}}
    if kind in ("text", "json_object"):
        return {"type": kind}
    raise APIError(400, f"text.format type {kind!r} is not supported: give text, json_object or json_schema",
                   "text")

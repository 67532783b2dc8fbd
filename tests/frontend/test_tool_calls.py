"""Tool calling's modes, constraints and parsing (frontend/tool_calls.py), without a server."""
import json

import pytest

from actorserve.frontend import tool_calls
from actorserve.frontend.protocol import ChatCompletionRequest

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
         {"type": "function", "function": {"name": "get_time"}}]


def request(**kw):
    return ChatCompletionRequest(messages=[{"role": "user", "content": "hi"}], **kw)


def test_modes_and_their_refusals():
    assert tool_calls.mode_of(request(), None) is None
    assert tool_calls.mode_of(request(tools=TOOLS, tool_choice="none"), None) is None
    assert tool_calls.mode_of(request(tools=TOOLS, tool_choice="required"), None).kind == "required"
    named = tool_calls.mode_of(request(tools=TOOLS, tool_choice={"type": "function",
                                                                 "function": {"name": "get_time"}}), None)
    assert (named.kind, named.name) == ("named", "get_time")
    assert tool_calls.mode_of(request(tools=TOOLS), "hermes") == tool_calls.ToolMode("auto", parser="hermes")
    for bad, why in [(dict(tools=TOOLS), "--enable-auto-tool-choice"),
                     (dict(tools=TOOLS, tool_choice="auto"), "--enable-auto-tool-choice"),
                     (dict(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "nope"}}), "nope"),
                     (dict(tool_choice="required"), "needs tools")]:
        with pytest.raises(ValueError, match=why):
            tool_calls.mode_of(request(**bad), None)


def test_constraints_are_the_tools_schemas():
    r = request(tools=TOOLS, tool_choice="required")
    schema = json.loads(json.dumps(tool_calls.constraint(r, tool_calls.mode_of(r, None))["json"]))
    assert schema["type"] == "array" and schema["minItems"] == 1
    names = [item["properties"]["name"]["enum"] for item in schema["items"]["anyOf"]]
    assert names == [["get_weather"], ["get_time"]]
    r = request(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "get_weather"}})
    assert tool_calls.constraint(r, tool_calls.mode_of(r, None)) == {"json": TOOLS[0]["function"]["parameters"]}
    both = request(tools=TOOLS, tool_choice="required", response_format={"type": "json_object"})
    both._tools_constraint = tool_calls.constraint(both, tool_calls.mode_of(both, None))
    with pytest.raises(ValueError, match="cannot be combined"):
        both.structured()


def test_calls_are_parsed_in_openais_shape():
    named = tool_calls.ToolMode("named", name="get_weather")
    content, calls = tool_calls.calls_of('{"city": "Paris"}', named)
    assert content is None and calls[0]["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'}
    assert calls[0]["type"] == "function" and calls[0]["id"].startswith("chatcmpl-tool-")
    required = tool_calls.ToolMode("required")
    _, calls = tool_calls.calls_of('[{"name": "get_time", "parameters": {}}, '
                                   '{"name": "get_weather", "parameters": {"city": "Rome"}}]', required)
    assert [c["function"]["name"] for c in calls] == ["get_time", "get_weather"]
    assert json.loads(calls[1]["function"]["arguments"]) == {"city": "Rome"}
    assert tool_calls.finish_reason(required, "stop", calls) == "tool_calls"
    assert tool_calls.finish_reason(named, "stop", calls) == "stop"  # as vLLM
    auto = tool_calls.ToolMode("auto", parser="hermes")
    text = 'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
    content, calls = tool_calls.calls_of(text, auto)
    assert content == "Let me check." and calls[0]["function"]["name"] == "get_weather"
    assert tool_calls.calls_of("Just text.", auto) == ("Just text.", [])
    bad = "<tool_call>{not json}</tool_call>"
    assert tool_calls.calls_of(bad, auto) == (bad, [])  # what does not parse stays text

"""Tool calling's modes, constraints and parsing (frontend/tool_calls.py), without a server."""
import json

import pytest

from actorserve.frontend import tool_calls
from actorserve.frontend.protocol import ChatCompletionRequest
from actorserve.runtime.text.output_parser import OutputParser

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


def _calls(mode, text):
    out = OutputParser(tools=tool_calls.parser_of(mode, TOOLS)).parse(text)
    return out.content, [tool_calls.call_json(c) for c in out.calls]


def test_calls_are_parsed_in_openais_shape():
    named = tool_calls.ToolMode("named", name="get_weather")
    content, calls = _calls(named, '{"city": "Paris"}')
    assert content is None and calls[0]["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'}
    assert calls[0]["type"] == "function" and calls[0]["id"].startswith("chatcmpl-tool-")
    required = tool_calls.ToolMode("required")
    _, calls = _calls(required, '[{"name": "get_time", "parameters": {}}, '
                                '{"name": "get_weather", "parameters": {"city": "Rome"}}]')
    assert [c["function"]["name"] for c in calls] == ["get_time", "get_weather"]
    assert json.loads(calls[1]["function"]["arguments"]) == {"city": "Rome"}
    assert tool_calls.finish_reason(required, "stop", calls) == "tool_calls"
    assert tool_calls.finish_reason(named, "stop", calls) == "stop"  # as vLLM
    auto = tool_calls.ToolMode("auto", parser="hermes")
    text = 'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
    content, calls = _calls(auto, text)
    assert content == "Let me check." and calls[0]["function"]["name"] == "get_weather"
    assert tool_calls.finish_reason(auto, "length", calls) == "tool_calls"  # a call, then max_tokens
    assert _calls(auto, "Just text.") == ("Just text.", [])
    assert _calls(required, '[{"name": "get_ti') == ('[{"name": "get_ti', [])  # cut short: the text is all there is

"""Tool calling through the HTTP server and the official client: a named function and "required" are
constrained to the tools' schemas, so their arguments always parse, streamed and not; "auto" needs the
server's --enable-auto-tool-choice and parser."""
import json

import openai
import pytest

from tests.e2e.server import API_KEY, Server
from tests.e2e.test_openai_server import MODEL

WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                            "unit": {"enum": ["celsius", "fahrenheit"]}},
           "required": ["city", "unit"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                           "parameters": WEATHER}},
         {"type": "function", "function": {"name": "get_time", "description": "The time in a city",
                                           "parameters": {"type": "object", "properties": {
                                               "city": {"type": "string", "maxLength": 20}},
                                               "required": ["city"], "additionalProperties": False}}}]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


def test_a_named_function_is_called_with_arguments_that_parse(client):
    choice = {"type": "function", "function": {"name": "get_weather"}}
    for seed in range(3):
        r = client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, tool_choice=choice,
                                           max_tokens=100, temperature=0.8, seed=seed)
        call = r.choices[0].message.tool_calls[0]
        assert call.function.name == "get_weather" and r.choices[0].finish_reason == "stop"
        assert set(json.loads(call.function.arguments)) == {"city", "unit"}
    stream = client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, tool_choice=choice,
                                            max_tokens=100, temperature=0, stream=True)
    deltas = [c.choices[0].delta for c in stream if c.choices]
    calls = [t for d in deltas for t in (d.tool_calls or [])]
    assert calls[0].id and calls[0].function.name == "get_weather"
    assert set(json.loads("".join(c.function.arguments or "" for c in calls))) == {"city", "unit"}


def test_required_calls_one_or_more_tools(client):
    r = client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, tool_choice="required",
                                       max_tokens=150, temperature=0)
    calls = r.choices[0].message.tool_calls
    assert calls and r.choices[0].finish_reason == "tool_calls"
    for call in calls:
        assert call.function.name in ("get_weather", "get_time")
        json.loads(call.function.arguments)
    stream = client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, tool_choice="required",
                                            max_tokens=150, temperature=0, stream=True)
    chunks = [c.choices[0] for c in stream if c.choices]
    streamed = [t for c in chunks for t in (c.delta.tool_calls or [])]
    assert [t.function.name for t in streamed] == [c.function.name for c in calls]
    assert chunks[-1].finish_reason == "tool_calls"


def test_auto_needs_the_servers_parser(client):
    with pytest.raises(openai.BadRequestError, match="enable-auto-tool-choice"):
        client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, tool_choice="auto", max_tokens=5)
    auto = Server("--enable-auto-tool-choice", "--tool-call-parser", "hermes")
    try:
        c = openai.OpenAI(base_url=auto.base_url + "/v1", api_key=API_KEY, max_retries=0)
        r = c.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, max_tokens=60, temperature=0)
        message = r.choices[0].message
        assert message.content or message.tool_calls  # the parser's answer either way, never an error
        for call in message.tool_calls or []:
            json.loads(call.function.arguments)
    finally:
        assert auto.stop() == 0

"""Tool calling through the HTTP server and the official client: a named function and "required" are
constrained to the tools' schemas, so their arguments always parse, streamed and not; "auto" needs the
server's --enable-auto-tool-choice and parser."""
import json

import openai
import pytest

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


def test_auto_needs_the_servers_parser(client, agent_client):
    with pytest.raises(openai.BadRequestError, match="enable-auto-tool-choice"):
        client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, tool_choice="auto", max_tokens=5)
    r = agent_client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, max_tokens=60, temperature=0)
    message = r.choices[0].message
    assert message.content or message.tool_calls  # the parser's answer either way, never an error
    for call in message.tool_calls or []:
        json.loads(call.function.arguments)


# the model made to write a hermes call and then run on to max_tokens (a regex: structured outputs)
CALL_THEN_MORE = ('<tool_call>\\{"name": "get_weather", "arguments": \\{"city": "Oslo", "unit": "celsius"\\}\\}'
                  '</tool_call>[a-z ]{300,400}')


def test_a_parsed_auto_call_finishes_as_tool_calls_whole_and_streamed(agent_client):
    """Even where the text after the call ran to max_tokens, as vLLM reports it."""
    kw = dict(model=MODEL, messages=ASK, tools=TOOLS, max_tokens=100, temperature=0,
              extra_body={"structured_outputs": {"regex": CALL_THEN_MORE}})
    r = agent_client.chat.completions.create(**kw)
    call = r.choices[0].message.tool_calls[0]
    assert r.choices[0].finish_reason == "tool_calls" and r.usage.completion_tokens == 100
    assert call.function.name == "get_weather" and json.loads(call.function.arguments)["city"] == "Oslo"
    chunks = [c.choices[0] for c in agent_client.chat.completions.create(**kw, stream=True) if c.choices]
    streamed = [t for c in chunks for t in (c.delta.tool_calls or [])]
    assert [(t.function.name, json.loads(t.function.arguments)) for t in streamed] == [
        (call.function.name, json.loads(call.function.arguments))]
    assert streamed[0].id and chunks[-1].finish_reason == "tool_calls"
    assert "".join(c.delta.content or "" for c in chunks) == (r.choices[0].message.content or "")

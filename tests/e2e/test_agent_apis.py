"""What agents reach for, driven with the official SDKs against a real server: OpenAI's Responses API
(``openai``), Anthropic's Messages API (``anthropic``), the OpenAI Agents SDK's default (Responses) model
on a one-tool agent, reasoning output, ``GET /v1/models/{id}`` and continuous usage stats."""
import asyncio
import json
import time

import anthropic
import openai
import pytest

from tests.e2e.server import API_KEY
from tests.e2e.test_openai_server import MODEL

WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}}, "required": ["city"],
           "additionalProperties": False}
TOOL = {"type": "function", "name": "get_weather", "description": "The weather in a city", "parameters": WEATHER}
CHOOSE = {"type": "function", "name": "get_weather"}
# qwen3's format, written by the model because a regex (structured outputs) makes it
THINK_THEN_ANSWER = "<think>[a-z ]{5,30}</think>[A-Z][a-z ]{5,30}"


@pytest.fixture(scope="module")
def claude(agent_server):
    return anthropic.Anthropic(base_url=agent_server.base_url, api_key=API_KEY, max_retries=0)


def test_models_retrieve_names_the_served_model(client):
    assert client.models.retrieve(MODEL).id == MODEL
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        client.models.retrieve("no-such-model")


def test_a_response_whole_and_streamed(agent_client):
    kw = dict(model=MODEL, input=[{"role": "user", "content": [{"type": "input_text", "text": "Say hello."}]}],
              instructions="Be brief.", max_output_tokens=12, temperature=0, metadata={"run": "1"})
    r = agent_client.responses.create(**kw)
    assert r.object == "response" and r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert r.output_text and r.usage.output_tokens == 12 and r.metadata == {"run": "1"}
    events = list(agent_client.responses.create(**kw, stream=True))
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.completed"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == r.output_text == events[-1].response.output_text  # greedy: the same answer


def test_a_function_tool_round_trip_through_previous_response_id(agent_client):
    first = agent_client.responses.create(model=MODEL, input="What is the weather in Paris?", tools=[TOOL],
                                          tool_choice=CHOOSE, max_output_tokens=40, temperature=0)
    call = first.output[0]
    assert call.type == "function_call" and call.name == "get_weather" and json.loads(call.arguments)["city"]
    assert agent_client.responses.retrieve(first.id).output[0].call_id == call.call_id
    stream = agent_client.responses.create(model=MODEL, input="What is the weather in Paris?", tools=[TOOL],
                                           tool_choice=CHOOSE, max_output_tokens=40, temperature=0, stream=True)
    events = list(stream)
    args = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    assert args == call.arguments == events[-1].response.output[0].arguments
    second = agent_client.responses.create(
        model=MODEL, previous_response_id=first.id, tools=[TOOL], max_output_tokens=30, temperature=0,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "Sunny, 24 C"}])
    assert second.previous_response_id == first.id and second.output_text
    # the follow-up saw the call and its result: the same turn sent whole gives the same answer
    whole = agent_client.responses.create(
        model=MODEL, tools=[TOOL], max_output_tokens=30, temperature=0,
        input=[{"role": "user", "content": "What is the weather in Paris?"},
               {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
               {"type": "function_call_output", "call_id": call.call_id, "output": "Sunny, 24 C"}])
    assert whole.output_text == second.output_text


def test_the_store_deletes_evicts_and_refuses_unknown_ids(agent_client):
    first = agent_client.responses.create(model=MODEL, input="Hi", max_output_tokens=1)
    assert agent_client.responses.delete(first.id) is None
    with pytest.raises(openai.NotFoundError, match="not in the store"):
        agent_client.responses.retrieve(first.id)
    with pytest.raises(openai.NotFoundError, match="previous_response_id"):
        agent_client.responses.create(model=MODEL, input="Hi", previous_response_id=first.id, max_output_tokens=1)
    oldest = agent_client.responses.create(model=MODEL, input="Hi", max_output_tokens=1)
    for _ in range(8):  # the store holds 8 (--responses-store-entries)
        agent_client.responses.create(model=MODEL, input="Hi", max_output_tokens=1)
    with pytest.raises(openai.NotFoundError, match="evicted"):
        agent_client.responses.retrieve(oldest.id)
    unstored = agent_client.responses.create(model=MODEL, input="Hi", max_output_tokens=1, store=False)
    with pytest.raises(openai.NotFoundError):
        agent_client.responses.retrieve(unstored.id)


def test_background_responses_run_and_cancel(agent_client):
    r = agent_client.responses.create(model=MODEL, input="Write a long story.", max_output_tokens=400,
                                      background=True, extra_body={"ignore_eos": True})
    assert r.status in ("queued", "in_progress")
    cancelled = agent_client.responses.cancel(r.id)
    assert cancelled.status == "cancelled" and agent_client.responses.retrieve(r.id).status == "cancelled"
    done = agent_client.responses.create(model=MODEL, input="Hi", max_output_tokens=5, background=True)
    deadline = time.monotonic() + 60
    while agent_client.responses.retrieve(done.id).status in ("queued", "in_progress"):
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert agent_client.responses.retrieve(done.id).output_text
    assert agent_client.responses.cancel(done.id).status in ("completed", "incomplete")  # finished: as it was
    foreground = agent_client.responses.create(model=MODEL, input="Hi", max_output_tokens=1)
    with pytest.raises(openai.BadRequestError, match="background"):
        agent_client.responses.cancel(foreground.id)


@pytest.mark.parametrize("body,param", [
    ({"tools": [{"type": "web_search"}]}, "tools"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "http://x"}]}]}, "input"),
    ({"truncation": "auto"}, "truncation"),
    ({"max_output_tokens": 0}, "max_output_tokens"),
    ({"text": {"format": {"type": "grammar"}}}, "text"),
])
def test_responses_refuse_what_they_cannot_serve_naming_it(agent_client, body, param):
    kw = {"model": MODEL, "input": "Hi", **body}
    with pytest.raises(openai.BadRequestError) as err:
        agent_client.post("/responses", body=kw, cast_to=object)
    assert err.value.body["param"] == param and err.value.body["type"] == "BadRequestError"


def test_a_json_schema_text_format_constrains_the_answer(agent_client):
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}}, "required": ["city"],
              "additionalProperties": False}
    r = agent_client.responses.create(model=MODEL, input="Name a city as JSON.", max_output_tokens=40,
                                      text={"format": {"type": "json_schema", "name": "city", "schema": schema}})
    assert set(json.loads(r.output_text)) == {"city"}


def test_messages_whole_streamed_and_counted(claude):
    kw = dict(model=MODEL, max_tokens=12, system=[{"type": "text", "text": "Be brief."}],
              messages=[{"role": "user", "content": "Say hello."}], extra_body={"temperature": 0})
    m = claude.messages.create(**kw)
    assert m.role == "assistant" and m.content[0].type == "text" and m.stop_reason in ("end_turn", "max_tokens")
    with claude.messages.stream(**kw) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == m.content[0].text == final.content[0].text and final.usage.output_tokens == m.usage.output_tokens
    counted = claude.messages.count_tokens(model=MODEL, system="Be brief.",
                                           messages=[{"role": "user", "content": "Say hello."}])
    assert counted.input_tokens == m.usage.input_tokens
    stopped = claude.messages.create(model=MODEL, max_tokens=40, messages=[{"role": "user", "content": "Count: 1 2 3"}],
                                     stop_sequences=["4"], extra_body={"temperature": 0})
    if stopped.stop_reason == "stop_sequence":
        assert stopped.stop_sequence == "4"


def test_an_output_config_schema_constrains_the_message(claude):
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}}, "required": ["city"],
              "additionalProperties": False}
    m = claude.messages.create(model=MODEL, max_tokens=40, messages=[{"role": "user", "content": "A city, as JSON"}],
                               output_config={"format": {"type": "json_schema", "schema": schema}})
    assert set(json.loads(m.content[0].text)) == {"city"}


def test_messages_tool_round_trip_streamed(claude):
    tools = [{"name": "get_weather", "description": "The weather in a city", "input_schema": WEATHER}]
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    with claude.messages.stream(model=MODEL, max_tokens=40, messages=ask, tools=tools,
                                tool_choice={"type": "tool", "name": "get_weather"}) as stream:
        first = stream.get_final_message()
    use = first.content[-1]
    assert first.stop_reason == "tool_use" and use.type == "tool_use" and use.name == "get_weather"
    assert isinstance(use.input["city"], str)
    follow = ask + [{"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
                    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "Sunny"}]}]
    second = claude.messages.create(model=MODEL, max_tokens=30, messages=follow, tools=tools)
    assert second.content and second.content[0].type in ("text", "tool_use")


def test_messages_errors_take_anthropics_shape(claude, agent_server):
    with pytest.raises(anthropic.BadRequestError) as err:
        claude.messages.create(model=MODEL, max_tokens=0, messages=[{"role": "user", "content": "Hi"}])
    assert err.value.body["type"] == "error" and err.value.body["error"]["type"] == "invalid_request_error"
    assert "max_tokens" in err.value.body["error"]["message"]
    with pytest.raises(anthropic.BadRequestError, match="image"):
        claude.messages.create(model=MODEL, max_tokens=5, messages=[{"role": "user", "content": [
            {"type": "image", "source": {"type": "url", "url": "http://x"}}]}])
    with pytest.raises(anthropic.NotFoundError):
        claude.messages.create(model="claude-sonnet-4-5", max_tokens=5, messages=[{"role": "user", "content": "Hi"}])
    wrong = anthropic.Anthropic(base_url=agent_server.base_url, api_key="wrong", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError):
        wrong.messages.create(model=MODEL, max_tokens=5, messages=[{"role": "user", "content": "Hi"}])


def test_reasoning_is_split_in_chat_responses_and_messages(agent_client, claude):
    regex = {"structured_outputs": {"regex": THINK_THEN_ANSWER}}
    kw = dict(model=MODEL, messages=[{"role": "user", "content": "Think, then answer."}], max_tokens=60,
              temperature=0, extra_body=regex)
    message = agent_client.chat.completions.create(**kw).choices[0].message
    reasoning = message.model_extra["reasoning"]
    assert reasoning and "<think>" not in reasoning and message.content and "</think>" not in message.content
    assert message.model_extra["reasoning_content"] == reasoning
    chunks = [c.choices[0].delta for c in agent_client.chat.completions.create(**kw, stream=True) if c.choices]
    assert "".join((d.model_extra or {}).get("reasoning") or "" for d in chunks) == reasoning
    assert "".join(d.content or "" for d in chunks) == message.content
    r = agent_client.responses.create(model=MODEL, input="Think, then answer.", max_output_tokens=60, temperature=0,
                                      extra_body=regex)
    assert [i.type for i in r.output] == ["reasoning", "message"] and r.output[0].content[0].text == reasoning
    assert 0 < r.usage.output_tokens_details.reasoning_tokens < r.usage.output_tokens
    m = claude.messages.create(model=MODEL, max_tokens=60,
                               messages=[{"role": "user", "content": "Think, then answer."}],
                               extra_body={"temperature": 0, **regex})
    assert [b.type for b in m.content] == ["thinking", "text"] and m.content[0].thinking == reasoning
    plain = agent_client.chat.completions.create(model=MODEL, messages=kw["messages"], max_tokens=8, temperature=0)
    assert plain.choices[0].message.content and plain.choices[0].message.model_extra.get("reasoning") is None


def test_continuous_usage_stats_put_usage_in_every_chunk(client):
    chunks = list(client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=6, temperature=0, stream=True,
        stream_options={"include_usage": True, "continuous_usage_stats": True}))
    counts = [c.usage.completion_tokens for c in chunks if c.choices and c.choices[0].delta.content]
    assert counts and counts == sorted(counts) and chunks[-1].usage.completion_tokens == 6
    assert all(c.usage is not None for c in chunks[1:])


def test_a_one_tool_agent_on_the_agents_sdks_default_model(agent_server):
    from agents import Agent, ModelSettings, Runner, function_tool, set_default_openai_client, set_tracing_disabled

    asked = []

    @function_tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        asked.append(city)
        return f"It is sunny in {city}."

    set_tracing_disabled(True)
    set_default_openai_client(openai.AsyncOpenAI(base_url=agent_server.base_url + "/v1", api_key=API_KEY,
                                                 max_retries=0), use_for_tracing=False)
    agent = Agent(name="weather", instructions="Answer with the weather tool.", tools=[get_weather], model=MODEL,
                  model_settings=ModelSettings(tool_choice="get_weather", max_tokens=40, temperature=0))
    result = asyncio.run(Runner.run(agent, "What is the weather in Paris?", max_turns=3))
    assert asked and isinstance(asked[0], str)
    assert isinstance(result.final_output, str) and result.final_output
    assert [i.type for i in result.new_items][:2] == ["tool_call_item", "tool_call_output_item"]

"""Structured outputs through the HTTP server and the official client: JSON schemas (response_format and
vLLM's structured_outputs), json_object, regex, choice and grammar; malformed ones are a 400 naming the
problem; a constrained request beside free ones leaves their outputs as they were."""
import asyncio
import json
import re

import jsonschema
import openai
import pytest

from tests.e2e.server import API_KEY
from tests.e2e.test_openai_server import MODEL

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "city": {"enum": ["Paris", "London", "Rome"]},
    },
    "required": ["name", "age", "city"],
    "additionalProperties": False,
}


def test_fifty_seeded_sampled_answers_all_parse_and_validate(server):
    client = openai.AsyncOpenAI(base_url=server.base_url + "/v1", api_key=API_KEY, max_retries=0)
    messages = [{"role": "user", "content": "Describe a person as JSON with name, age and city."}]
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA}}

    async def one(seed):
        r = await client.chat.completions.create(model=MODEL, messages=messages, temperature=1.0, seed=seed,
                                                 max_tokens=200, response_format=fmt)
        return r.choices[0]

    async def all_of_them():
        try:
            return await asyncio.gather(*(one(seed) for seed in range(50)))
        finally:
            await client.close()
    choices = asyncio.run(all_of_them())
    for c in choices:
        assert c.finish_reason == "stop", c.message.content
        jsonschema.validate(json.loads(c.message.content), SCHEMA)
    assert len({c.message.content for c in choices}) > 5  # sampled, not one answer


def test_regex_choice_grammar_and_json_object(client):
    phone = client.completions.create(model=MODEL, prompt="My phone number is", max_tokens=20, temperature=0.9,
                                      seed=1, extra_body={"structured_outputs": {"regex": r"[0-9]{3}-[0-9]{4}"}})
    assert re.fullmatch(r"[0-9]{3}-[0-9]{4}", phone.choices[0].text)
    options = ["yes", "no", "it depends"]
    for seed in range(5):
        pick = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Is it raining?"}],
                                              max_tokens=10, temperature=1.0, seed=seed,
                                              extra_body={"structured_outputs": {"choice": options}})
        assert pick.choices[0].message.content in options
    grammar = 'root ::= "The answer is " digit digit "."\ndigit ::= [0-9]'
    g = client.completions.create(model=MODEL, prompt="Q: 6 times 7?", max_tokens=20, temperature=0,
                                  extra_body={"structured_outputs": {"grammar": grammar}})
    assert re.fullmatch(r"The answer is [0-9]{2}\.", g.choices[0].text)
    obj = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Give a JSON object for a cat with its name and age."}],
        max_tokens=200, temperature=0, response_format={"type": "json_object"})
    assert obj.choices[0].finish_reason == "stop"
    assert isinstance(json.loads(obj.choices[0].message.content), dict)
    old = client.completions.create(model=MODEL, prompt="Pick one:", max_tokens=10, temperature=0,
                                    extra_body={"guided_choice": options})  # vLLM's older spelling
    assert old.choices[0].text in options


def test_streamed_answers_are_constrained_too(client):
    stream = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "A person as JSON."}], max_tokens=200, temperature=0,
        stream=True, response_format={"type": "json_schema", "json_schema": {"name": "p", "schema": SCHEMA}})
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    jsonschema.validate(json.loads(text), SCHEMA)


@pytest.mark.parametrize("extra,needle", [
    ({"structured_outputs": {"json": {"type": "objectx"}}}, "objectx"),
    ({"structured_outputs": {"regex": "(abc"}}, "parenthesis"),
    ({"structured_outputs": {"grammar": 'root ::= "a" |'}}, "grammar"),
    ({"structured_outputs": {"json": "{not json"}}, "not valid JSON"),
    ({"structured_outputs": {"regex": "a", "choice": ["b"]}}, "exactly one"),
    ({"structured_outputs": {"jsn": {}}}, "unknown keys"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, "schema"),
    ({"response_format": {"type": "json_object"}, "structured_outputs": {"regex": "a"}}, "one of"),
])
def test_malformed_constraints_are_a_400_naming_the_problem(client, extra, needle):
    with pytest.raises(openai.BadRequestError, match=needle):
        client.completions.create(model=MODEL, prompt="Hi", max_tokens=5, extra_body=extra)


def test_a_grammar_past_its_compile_budget_is_a_400_and_the_server_goes_on(client):
    """A 1 MB choice (1024 alternatives of 1000 characters) compiled for minutes on the one grammar thread;
    the server's budget here is 5 s: a 400 within it, streamed or not, and the next constrained request is
    served."""
    import time

    from tests.runtime.engine.test_structured_outputs import big_choice_text

    choices = [big_choice_text(i) for i in range(1024)]
    for stream in (False, True):
        start = time.monotonic()
        with pytest.raises(openai.BadRequestError, match="did not compile within 5 s"):
            client.completions.create(model=MODEL, prompt="Pick:", max_tokens=5, stream=stream,
                                      extra_body={"structured_outputs": {"choice": choices}})
        assert time.monotonic() - start < 30
    pick = client.completions.create(model=MODEL, prompt="Pick one:", max_tokens=10, temperature=0,
                                     extra_body={"structured_outputs": {"choice": ["yes", "no"]}})
    assert pick.choices[0].text in ("yes", "no")


def test_a_constrained_request_leaves_free_ones_unchanged(client):
    prompts = ["The capital of France is", "1, 2, 3,", "Once upon a time"]

    def free():
        return [client.completions.create(model=MODEL, prompt=p, max_tokens=24, temperature=0).choices[0].text
                for p in prompts]
    alone = free()
    sync_client = client

    async def together():
        aclient = openai.AsyncOpenAI(base_url=str(sync_client.base_url), api_key=API_KEY, max_retries=0)
        try:
            constrained = aclient.completions.create(
                model=MODEL, prompt="JSON:", max_tokens=64, temperature=0,
                extra_body={"structured_outputs": {"json": SCHEMA}})
            frees = [aclient.completions.create(model=MODEL, prompt=p, max_tokens=24, temperature=0)
                     for p in prompts]
            results = await asyncio.gather(constrained, *frees)
            return [r.choices[0].text for r in results[1:]]
        finally:
            await aclient.close()
    assert asyncio.run(together()) == alone

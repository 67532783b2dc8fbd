"""Acceptance: the real ``actorserve serve`` through the official openai client."""
import asyncio
import socket
import time

import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.server import API_KEY, http

MODEL = "SmolLM2-135M-Instruct"


def test_greedy_chat_matches_the_reference(client, greedy_reference):
    for ref in greedy_reference["prompts"]:
        messages = [{"role": "user", "content": ref["user_prompt"]}]
        resp = client.chat.completions.create(model=MODEL, messages=messages, temperature=0, max_tokens=64)
        assert resp.choices[0].message.content == ref["output_text"]
        assert resp.choices[0].finish_reason == ("stop" if ref["stopped_on_eos"] else "length")
        assert resp.usage.prompt_tokens == len(ref["prompt_ids"])
        assert resp.usage.completion_tokens == len(ref["output_ids"])
        assert resp.usage.total_tokens == len(ref["prompt_ids"]) + len(ref["output_ids"])
        chunks = list(client.chat.completions.create(model=MODEL, messages=messages, temperature=0, max_tokens=64,
                                                     stream=True, stream_options={"include_usage": True}))
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert text == ref["output_text"]
        assert chunks[-1].usage.completion_tokens == len(ref["output_ids"])
        assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == \
            [resp.choices[0].finish_reason]


def test_models_version_tokenize_detokenize(server, client, greedy_reference):
    assert [m.id for m in client.models.list().data] == [MODEL]
    ref = greedy_reference["prompts"][0]
    headers = {"Authorization": f"Bearer {API_KEY}"}
    tok = http("POST", server.base_url + "/tokenize", {"prompt": ref["templated_prompt"]}, headers=headers).json()
    assert tok["tokens"] == ref["prompt_ids"] and tok["count"] == len(ref["prompt_ids"])
    chat = http("POST", server.base_url + "/tokenize", {"messages": [{"role": "user", "content": ref["user_prompt"]}]})
    assert chat.json()["tokens"] == ref["prompt_ids"]
    detok = http("POST", server.base_url + "/detokenize", {"tokens": ref["output_ids"][:-1]}).json()
    assert detok["prompt"] == ref["output_text"]
    assert http("GET", server.base_url + "/version").json()["version"]


def test_completion_echo_logprobs_and_stops(client, greedy_reference):
    prompt = "The capital of France is"
    plain = client.completions.create(model=MODEL, prompt=prompt, temperature=0, max_tokens=8)
    echoed = client.completions.create(model=MODEL, prompt=prompt, temperature=0, max_tokens=8, echo=True)
    assert echoed.choices[0].text == prompt + plain.choices[0].text
    lp = client.completions.create(model=MODEL, prompt=prompt, temperature=0, max_tokens=5, logprobs=3).choices[0]
    assert len(lp.logprobs.tokens) == 5 and "".join(lp.logprobs.tokens) == lp.text
    assert all(len(top) >= 3 for top in lp.logprobs.top_logprobs)
    assert all(max(top.values()) == pytest.approx(v) for top, v in zip(lp.logprobs.top_logprobs,
                                                                       lp.logprobs.token_logprobs))
    assert lp.logprobs.text_offset == [sum(len(t) for t in lp.logprobs.tokens[:i]) for i in range(5)]

    ref = greedy_reference["prompts"][1]
    stop_text = client.completions.create(model=MODEL, prompt=ref["prompt_ids"], temperature=0, max_tokens=64,
                                          stop=["ocean,"]).choices[0]
    assert stop_text.text == ref["output_text"].split("ocean,")[0] and stop_text.finish_reason == "stop"
    stop_id = client.completions.create(model=MODEL, prompt=ref["prompt_ids"], temperature=0, max_tokens=64,
                                        extra_body={"stop_token_ids": [ref["output_ids"][3]]}).choices[0]
    assert stop_id.finish_reason == "stop" and stop_id.model_extra["stop_reason"] == ref["output_ids"][3]


def test_n_with_seed_and_batched_prompts(client):
    def run():
        r = client.completions.create(model=MODEL, prompt="Once upon a time", n=3, seed=11, temperature=1.0,
                                      max_tokens=12)
        return [c.text for c in sorted(r.choices, key=lambda c: c.index)]

    first = run()
    assert first == run() and len(set(first)) == 3
    batch = client.completions.create(model=MODEL, prompt=["Hello", "The sky", "Once"], temperature=0,
                                      max_tokens=3, n=2, extra_body={"ignore_eos": True})
    assert sorted(c.index for c in batch.choices) == list(range(6))
    assert batch.usage.completion_tokens == 18
    alone = client.completions.create(model=MODEL, prompt="The sky", temperature=0, max_tokens=3)
    assert [c.text for c in batch.choices if c.index in (2, 3)] == [alone.choices[0].text] * 2
    ids = client.completions.create(model=MODEL, prompt=[[1, 2, 3], [4, 5]], temperature=0, max_tokens=2,
                                    extra_body={"ignore_eos": True})
    assert ids.usage.prompt_tokens == 5 and len(ids.choices) == 2


def test_chat_echo_only_repeats_a_trailing_assistant_message(client):
    user = [{"role": "user", "content": "Name a colour."}]
    cont = user + [{"role": "assistant", "content": "My favourite colour is"}]
    extra = {"echo": True, "add_generation_prompt": False, "continue_final_message": True}
    resp = client.chat.completions.create(model=MODEL, messages=cont, temperature=0, max_tokens=6, extra_body=extra)
    content = resp.choices[0].message.content
    assert content.startswith("My favourite colour is") and len(content) > len("My favourite colour is")
    streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
        model=MODEL, messages=cont, temperature=0, max_tokens=6, extra_body=extra, stream=True) if c.choices)
    assert streamed == content
    no_echo = client.chat.completions.create(model=MODEL, messages=user, temperature=0, max_tokens=6,
                                             extra_body={"echo": True})
    plain = client.chat.completions.create(model=MODEL, messages=user, temperature=0, max_tokens=6)
    assert no_echo.choices[0].message.content == plain.choices[0].message.content  # the user's turn is not echoed


def test_chat_logprobs(client):
    resp = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}], temperature=0,
                                          max_tokens=4, logprobs=True, top_logprobs=2)
    content = resp.choices[0].logprobs.content
    assert len(content) == resp.usage.completion_tokens
    assert all(len(c.top_logprobs) == 2 and c.top_logprobs[0].logprob == pytest.approx(c.logprob) for c in content)


def test_request_id_is_honoured(server):
    r = http("POST", server.base_url + "/v1/completions", {"prompt": "Hi", "max_tokens": 2},
             headers={"Authorization": f"Bearer {API_KEY}", "X-Request-Id": "my-id-7"})
    assert r.status_code == 200 and r.headers["x-request-id"] == "my-id-7" and r.json()["id"] == "cmpl-my-id-7"


async def test_64_streams_and_50_disconnects_leave_the_pool_free(server):
    aclient = openai.AsyncOpenAI(base_url=server.base_url + "/v1", api_key=API_KEY, max_retries=0)

    async def full(i):
        # (ignore_eos: every stream runs its 16 tokens, whatever its seed samples)
        stream = await aclient.completions.create(model=MODEL, prompt=f"Story {i}:", max_tokens=16, temperature=0.8,
                                                  seed=i, stream=True, extra_body={"ignore_eos": True})
        return [c async for c in stream]

    async def leave(i):
        stream = await aclient.completions.create(model=MODEL, prompt=f"Count {i}:", max_tokens=300,
                                                  temperature=0.8, extra_body={"ignore_eos": True}, stream=True)
        count = 0
        async for _ in stream:
            count += 1
            if count == 3:
                break
        await stream.close()

    results = await asyncio.gather(*[full(i) for i in range(64)])
    assert all(r[-1].choices[0].finish_reason == "length" for r in results)
    await asyncio.gather(*[leave(i) for i in range(50)])
    for _ in range(100):
        metrics = scrape(server)
        if metrics["vllm:num_requests_running"] == 0 and metrics["vllm:kv_cache_usage_perc"] == 0:
            break
        await asyncio.sleep(0.1)
    assert metrics["vllm:num_requests_running"] == 0 and metrics["vllm:num_requests_waiting"] == 0
    assert metrics["vllm:kv_cache_usage_perc"] == 0
    await aclient.close()


def scrape(server) -> dict:
    text = http("GET", server.base_url + "/metrics").text
    values = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            values.setdefault(sample.name, sample.value)
    return values


def test_metrics_move(server, client):
    before = scrape(server)
    client.completions.create(model=MODEL, prompt="Hello there", max_tokens=5, temperature=0,
                              extra_body={"ignore_eos": True})
    after = scrape(server)
    assert after["vllm:generation_tokens_total"] - before["vllm:generation_tokens_total"] == 5
    assert after["vllm:prompt_tokens_total"] > before["vllm:prompt_tokens_total"]
    assert after["vllm:time_to_first_token_seconds_count"] == before["vllm:time_to_first_token_seconds_count"] + 1
    assert after["vllm:e2e_request_latency_seconds_count"] == before["vllm:e2e_request_latency_seconds_count"] + 1
    assert "vllm:prefix_cache_hits_total" in after and "vllm:time_per_output_token_seconds_count" in after


def test_a_non_streaming_client_that_leaves_is_aborted(server):
    body = {"prompt": "Count:", "max_tokens": 900, "ignore_eos": True}
    try:
        http("POST", server.base_url + "/v1/completions", body, headers={"Authorization": f"Bearer {API_KEY}"},
             timeout=1.5)
    except (TimeoutError, socket.timeout, OSError):
        pass  # the client gave up and closed the connection
    deadline = time.monotonic() + 10  # 900 tokens would take far longer than this
    while time.monotonic() < deadline:
        if scrape(server)["vllm:num_requests_running"] == 0:
            break
        time.sleep(0.1)
    metrics = scrape(server)
    assert metrics["vllm:num_requests_running"] == 0 and metrics["vllm:kv_cache_usage_perc"] == 0

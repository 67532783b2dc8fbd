"""``actorserve bench serve`` against the real server: every token counted, errors reported, not fatal."""
import argparse
import asyncio
import json

import pytest

from actorserve.benchmarks import serve as bench_serve
from actorserve.benchmarks.sse_client import HTTPStatusError, post_sse
from tests.e2e.server import API_KEY


def args_for(server, tmp_path, **over):
    p = argparse.ArgumentParser()
    bench_serve.add_arguments(p)
    argv = ["--base-url", server.base_url, "--model", over.pop("model", server_model(server)), "--api-key", API_KEY,
            "--num-prompts", "6", "--input-len", "12", "--output-len", "5", "--max-concurrency", "3",
            "--result-file", str(tmp_path / "result.json"), "--no-progress"]
    for k, v in over.items():
        argv += [f"--{k.replace('_', '-')}", str(v)]
    return p.parse_args(argv)


def server_model(server) -> str:
    from tests.e2e.server import http
    return http("GET", server.base_url + "/v1/models", headers={"Authorization": f"Bearer {API_KEY}"}).json()[
        "data"][0]["id"]


def test_bench_serve_counts_every_token(server, tmp_path):
    args = args_for(server, tmp_path)
    assert bench_serve.main(args) == 0
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["completed"] == 6 and result["failed"] == 0
    assert result["output_throughput"] * result["duration"] == pytest.approx(6 * 5)  # ignore_eos: output-len each
    assert result["total_output_tokens"] == 30 and result["total_input_tokens"] == 6 * 12
    assert result["median_ttft_ms"] > 0 and result["median_tpot_ms"] > 0 and result["mean_itl_ms"] > 0
    assert result["p99_e2el_ms"] >= result["median_e2el_ms"] > 0


def test_without_ignore_eos_an_answer_ends_where_the_model_ends_it(server, tmp_path):
    """The chat prompt "Say hi." is answered in a few tokens and EOS, well under 60."""
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"prompt": "Say hi."}) + "\n")
    args = args_for(server, tmp_path, backend="openai-chat", dataset_name="custom", dataset_path=prompts,
                    num_prompts=1, output_len=60)
    args.ignore_eos = False
    assert bench_serve.main(args) == 0
    assert 0 < json.loads((tmp_path / "result.json").read_text())["total_output_tokens"] < 60
    args.ignore_eos = True
    assert bench_serve.main(args) == 0
    assert json.loads((tmp_path / "result.json").read_text())["total_output_tokens"] == 60


def test_vllm_bench_serve_flags_and_result_keys(server, tmp_path):
    """The flags of ``vllm bench serve`` and its JSON keys: chat backend, custom and sharegpt datasets,
    percentiles, --save-result into --result-dir."""
    p = argparse.ArgumentParser()
    bench_serve.add_arguments(p)
    common = ["--base-url", server.base_url, "--model", server_model(server), "--api-key", API_KEY,
              "--num-prompts", "3", "--max-concurrency", "2", "--no-progress", "--save-result",
              "--result-dir", str(tmp_path / "results"), "--percentile-metrics", "ttft,e2el",
              "--metric-percentiles", "50,90"]
    chat = p.parse_args(common + ["--backend", "openai-chat", "--random-input-len", "8",
                                  "--random-output-len", "4", "--result-filename", "chat.json"])
    assert bench_serve.main(chat) == 0
    result = json.loads((tmp_path / "results" / "chat.json").read_text())
    assert result["backend"] == "openai-chat" and result["completed"] == 3 and result["total_output_tokens"] == 12
    assert {"mean_ttft_ms", "median_ttft_ms", "std_ttft_ms", "p50_ttft_ms", "p90_ttft_ms", "p90_e2el_ms",
            "request_throughput", "output_throughput", "total_token_throughput"} <= set(result)
    assert "mean_tpot_ms" not in result and len(result["generated_texts"]) == 3

    (tmp_path / "custom.jsonl").write_text("".join(json.dumps({"prompt": f"Tell me about {w}."}) + "\n"
                                                   for w in ("cats", "dogs", "rain")))
    custom = p.parse_args(common + ["--dataset-name", "custom", "--dataset-path", str(tmp_path / "custom.jsonl"),
                                    "--random-output-len", "3", "--result-filename", "custom.json"])
    assert bench_serve.main(custom) == 0
    assert json.loads((tmp_path / "results" / "custom.json").read_text())["total_output_tokens"] == 9

    turns = [{"from": "human", "value": "Hi there"}, {"from": "gpt", "value": "Hello friend"}]
    conversations = [{"conversations": turns} for _ in range(3)]
    (tmp_path / "sharegpt.json").write_text(json.dumps(conversations))
    sharegpt = p.parse_args(common + ["--dataset-name", "sharegpt", "--dataset-path", str(tmp_path / "sharegpt.json"),
                                      "--result-filename", "sharegpt.json"])
    assert bench_serve.main(sharegpt) == 0
    result = json.loads((tmp_path / "results" / "sharegpt.json").read_text())
    assert result["output_lens"] == [2, 2, 2]  # "Hello friend": two tokens, the reply's length


def test_bench_serve_reports_a_refused_request(server, tmp_path):
    args = args_for(server, tmp_path, model="no-such-model", num_prompts=2)
    assert bench_serve.main(args) == 1
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["failed"] == 2 and "HTTP 404" in result["errors"][0]


def test_sse_client_yields_events_until_done(server):
    async def collect():
        events = []
        async for event in post_sse(server.base_url + "/v1/completions",
                                    {"model": server_model(server), "prompt": [1, 2, 3], "max_tokens": 3,
                                     "stream": True, "ignore_eos": True},
                                    {"Authorization": f"Bearer {API_KEY}"}):
            events.append(event)
        return events

    events = asyncio.run(collect())
    assert sum(len(e["choices"]) for e in events) >= 3 and events[-1]["choices"][0]["finish_reason"] == "length"

    async def unauthorised():
        async for _ in post_sse(server.base_url + "/v1/completions", {"model": "x", "prompt": [1]}):
            pass

    try:
        asyncio.run(unauthorised())
    except HTTPStatusError as exc:
        assert exc.status == 401
    else:
        raise AssertionError("a 401 was not raised")

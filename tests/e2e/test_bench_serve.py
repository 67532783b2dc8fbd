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
    assert result["output_tok_s"] * result["duration_s"] == pytest.approx(6 * 5)  # ignore_eos: output-len each
    assert result["ttft_ms"]["median"] > 0 and result["tpot_ms"]["median"] > 0
    assert result["itl_ms"]["mean"] > 0


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

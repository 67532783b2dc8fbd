"""``actorserve serve --data-parallel-size 2``: two engine rings behind one frontend.

Requests spread over both replicas by outstanding requests; a seeded request's answer does not depend on
which replica serves it; an abort reaches the replica that holds the request; a replica that dies fails
only its own streams while the other serves on, and /health and /metrics say which one died."""
import concurrent.futures
import os
import signal
import time

import openai
import psutil
import pytest

from tests.e2e.server import API_KEY, Server, http

MODEL = "SmolLM2-135M-Instruct"


@pytest.fixture(scope="module")
def dp_server():
    s = Server("--data-parallel-size", "2")
    yield s
    assert s.stop() in (0, 1)  # 1 once a replica died (the test kills one)


def _client(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key=API_KEY, max_retries=0)


def _seeded(server: Server, max_tokens: int = 48) -> str:
    return _client(server).completions.create(model=MODEL, prompt="Once upon a time", max_tokens=max_tokens,
                                              temperature=1.0, seed=1234,
                                              extra_body={"ignore_eos": True}).choices[0].text


def _cpu(pid: int) -> float:
    times = psutil.Process(pid).cpu_times()
    return times.user + times.system


def _running(server: Server) -> float:
    page = http("GET", server.base_url + "/metrics").text
    return sum(float(line.rsplit(" ", 1)[1]) for line in page.splitlines()
               if line.startswith("vllm:num_requests_running{"))


def test_both_replicas_serve_and_seeded_answers_agree(dp_server):
    workers = [dp_server.child_pid("worker0"), dp_server.child_pid("worker0-dp1")]
    before = [_cpu(pid) for pid in workers]
    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        answers = list(pool.map(lambda _: _seeded(dp_server), range(6)))
    used = [_cpu(pid) - b for pid, b in zip(workers, before)]
    assert all(u > 0.5 for u in used), used  # both replicas computed
    assert len(set(answers)) == 1, answers  # whichever replica served it, and beside whatever


def test_an_abort_reaches_the_replica_that_holds_the_request(dp_server):
    client = _client(dp_server)
    streams = [client.completions.create(model=MODEL, prompt="Count to a thousand:", max_tokens=800, stream=True,
                                         extra_body={"ignore_eos": True}) for _ in range(2)]
    for stream in streams:
        next(iter(stream))
    assert _running(dp_server) == 2
    for stream in streams:
        stream.close()
    deadline = time.monotonic() + 10
    while _running(dp_server) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _running(dp_server) == 0


def test_a_dead_replica_fails_only_its_own_streams(dp_server):
    reference = _seeded(dp_server)
    client = _client(dp_server)
    streams = [client.completions.create(model=MODEL, prompt="Count to a thousand:", max_tokens=300, stream=True,
                                         extra_body={"ignore_eos": True}) for _ in range(2)]
    for stream in streams:
        next(iter(stream))  # one on each replica (both were idle)
    os.kill(dp_server.child_pid("worker0-dp1"), signal.SIGKILL)
    outcomes = []
    for stream in streams:
        try:
            chunks = list(stream)
            outcomes.append("finished" if chunks[-1].choices[0].finish_reason == "length" else "cut")
        except openai.APIError:
            outcomes.append("failed")
    assert sorted(outcomes) in (["failed", "finished"], ["cut", "finished"]), outcomes
    health = http("GET", dp_server.base_url + "/health")
    assert health.status_code == 200 and health.json()["status"] == "degraded"
    states = {r["rank"]: r["alive"] for r in health.json()["replicas"]}
    assert states == {0: True, 1: False}
    metrics = http("GET", dp_server.base_url + "/metrics").text
    assert 'actorserve:engine_replica_up{engine="1",model_name="SmolLM2-135M-Instruct"} 0.0' in metrics
    assert 'actorserve:engine_replica_up{engine="0",model_name="SmolLM2-135M-Instruct"} 1.0' in metrics
    assert _seeded(dp_server) == reference  # the live replica takes every new request

"""Sleep mode through the OpenAI server's operator endpoints (vLLM's /sleep, /wake_up, /is_sleeping).

They exist only with --enable-sleep-mode and take the API key. While asleep, a completion is refused with
503 in the OpenAI error shape (or, with --sleep-queue-requests, waits and is answered after wake-up); a
request in flight when sleep arrives is kept and finishes after wake-up; greedy answers are unchanged."""
import concurrent.futures
import time

import openai
import psutil
import pytest

from tests.e2e.server import API_KEY, Server, http

AUTH = {"Authorization": f"Bearer {API_KEY}"}
PROMPT = "The capital of France is"


def _client(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key=API_KEY, max_retries=0)


def _complete(server: Server, max_tokens: int = 24) -> str:
    return _client(server).completions.create(model="SmolLM2-135M-Instruct", prompt=PROMPT, max_tokens=max_tokens,
                                              temperature=0, extra_body={"ignore_eos": True}).choices[0].text


def _is_sleeping(server: Server) -> bool:
    reply = http("GET", server.base_url + "/is_sleeping", headers=AUTH)
    assert reply.status_code == 200, reply.text
    return reply.json()["is_sleeping"]


@pytest.fixture(scope="module")
def sleepy():
    s = Server("--enable-sleep-mode")
    yield s
    assert s.stop() == 0


def test_sleep_refuse_wake_and_answer_the_same(sleepy):
    before = _complete(sleepy)
    worker = psutil.Process(sleepy.child_pid("worker0"))
    awake_rss = worker.memory_info().rss
    for level in (1, 2):
        assert http("POST", sleepy.base_url + f"/sleep?level={level}", headers=AUTH).status_code == 200
        assert _is_sleeping(sleepy)
        assert awake_rss - worker.memory_info().rss > 80 << 20  # the weights (92 MiB of GGUF blocks) went back
        with pytest.raises(openai.APIStatusError) as refused:
            _complete(sleepy)
        assert refused.value.status_code == 503
        assert refused.value.body["type"] == "ServiceUnavailableError" and "asleep" in refused.value.body["message"]
        assert http("POST", sleepy.base_url + "/wake_up?tags=weights", headers=AUTH).status_code == 200
        assert _is_sleeping(sleepy)  # the KV cache is still released
        assert http("POST", sleepy.base_url + "/wake_up", headers=AUTH).status_code == 200
        assert not _is_sleeping(sleepy)
        assert _complete(sleepy) == before


def test_a_request_in_flight_when_sleep_arrives_finishes_after_wake_up(sleepy):
    reference = _complete(sleepy, max_tokens=300)  # seconds of decoding
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        running = pool.submit(_complete, sleepy, 300)
        time.sleep(0.3)
        assert http("POST", sleepy.base_url + "/sleep?level=1", headers=AUTH).status_code == 200
        time.sleep(0.5)
        assert not running.done()  # kept, not failed
        assert http("POST", sleepy.base_url + "/wake_up", headers=AUTH).status_code == 200
        assert running.result(timeout=60) == reference


def test_bad_arguments_are_400s_and_the_key_is_required(sleepy):
    reply = http("POST", sleepy.base_url + "/sleep?level=3", headers=AUTH)
    assert reply.status_code == 400 and "sleep level" in reply.json()["error"]["message"]
    reply = http("POST", sleepy.base_url + "/wake_up?tags=everything", headers=AUTH)
    assert reply.status_code == 400 and "tags" in reply.json()["error"]["message"]
    assert http("POST", sleepy.base_url + "/sleep").status_code == 401
    assert not _is_sleeping(sleepy)


def test_without_the_flag_there_are_no_sleep_endpoints(server):
    for method, path in (("POST", "/sleep"), ("POST", "/wake_up"), ("GET", "/is_sleeping")):
        assert http(method, server.base_url + path, headers=AUTH).status_code == 404


def test_queued_requests_wait_for_wake_up():
    server = Server("--enable-sleep-mode", "--sleep-queue-requests")
    try:
        before = _complete(server)
        assert http("POST", server.base_url + "/sleep?level=2", headers=AUTH).status_code == 200
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            waiting = pool.submit(_complete, server)
            time.sleep(1.0)
            assert not waiting.done()
            assert http("POST", server.base_url + "/wake_up", headers=AUTH).status_code == 200
            assert waiting.result(timeout=60) == before
    finally:
        assert server.stop() == 0

"""Acceptance: a hung child (SIGSTOP) is detected by its missing heartbeats within --hang-timeout: open
streams end with an error event, /health turns 503, new requests fail fast, and the server exits 1 with
every child gone (a stopped process is killed too)."""
from __future__ import annotations

import json
import os
import signal
import threading
import time

import pytest

from tests.e2e.server import AUTH, Server, http, read_stream

HANG_TIMEOUT = 3.0


@pytest.mark.parametrize("child", ["worker0", "scheduler"])
def test_a_stopped_child_is_declared_dead(child):
    server = Server("--hang-timeout", str(HANG_TIMEOUT))
    try:
        assert http("GET", server.base_url + "/health").status_code == 200
        events, started = [], threading.Event()
        reader = threading.Thread(target=read_stream, args=(server.port, 900, events, started), daemon=True)
        reader.start()
        assert started.wait(60)
        os.kill(server.child_pid(child), signal.SIGSTOP)
        stopped = time.monotonic()
        reader.join(HANG_TIMEOUT + 5)
        assert not reader.is_alive(), "the stream hung"
        assert events[-1] == "[DONE]"
        error = json.loads(events[-2])["error"]
        assert error["code"] == 503 and "stopped answering" in error["message"] and child in error["message"]
        assert time.monotonic() - stopped < HANG_TIMEOUT + 3
        assert http("GET", server.base_url + "/health", timeout=5).status_code == 503
        start = time.monotonic()
        r = http("POST", server.base_url + "/v1/completions", {"prompt": "hi"}, headers=AUTH, timeout=10)
        assert r.status_code == 503 and time.monotonic() - start < 1, r.text
        server.proc.wait(15)
    finally:
        code = server.stop()
    assert code == 1


def test_a_step_that_computes_past_the_hang_timeout_is_slow_not_hung():
    """A 2048-token prefill chunk takes about two seconds here, twice the hang timeout: the worker's loop
    does not turn meanwhile, but it computes, so it keeps beating; the request completes, the server stays
    healthy, and the log names the step as slow."""
    server = Server("--hang-timeout", "1", "--max-model-len", "4096", "--kv-cache-memory", str(256 << 20))
    try:
        r = http("POST", server.base_url + "/v1/completions", {"prompt": list(range(1000, 3000)), "max_tokens": 2},
                 headers=AUTH, timeout=120)
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["prompt_tokens"] == 2000
        assert http("GET", server.base_url + "/health", timeout=5).status_code == 200
        assert b"slow, not hung" in server.output()
    finally:
        assert server.stop() == 0

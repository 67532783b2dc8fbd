"""SIGTERM drains the server: from the signal on, new requests and /health get a 503; the streams in flight
run on for up to --shutdown-timeout, those that finish by then end as usual, the others with an error
event (503) and [DONE]; then the server exits 0 with every child gone."""
from __future__ import annotations

import json
import signal
import threading
import time

from tests.e2e.server import AUTH, Server, http, read_stream

TIMEOUT = 3.0


def test_sigterm_lets_streams_finish_within_the_timeout_then_ends_the_rest_and_exits_0():
    server = Server("--shutdown-timeout", str(TIMEOUT))
    code = None
    try:
        streams = [(8 if i % 2 else 900, [], threading.Event()) for i in range(16)]  # short and long, mixed
        threads = [threading.Thread(target=read_stream, args=(server.port, n, ev, st), daemon=True)
                   for n, ev, st in streams]
        for t in threads:
            t.start()
        assert all(st.wait(60) for _, _, st in streams)
        server.proc.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        time.sleep(0.3)
        assert http("GET", server.base_url + "/health", timeout=5).status_code == 503
        r = http("POST", server.base_url + "/v1/completions", {"prompt": "hi", "max_tokens": 1}, headers=AUTH,
                 timeout=5)
        assert r.status_code == 503 and "shutting down" in r.json()["error"]["message"], r.text
        for t in threads:
            t.join(TIMEOUT + 10)
        assert not any(t.is_alive() for t in threads), "a stream hung"
        assert time.monotonic() - signalled < TIMEOUT + 5
        for n, events, _ in streams:
            assert events[-1] == "[DONE]"
            if n == 8:  # finished in time: its tokens, no error
                assert not any("error" in json.loads(e) for e in events[:-1])
                assert json.loads(events[-2])["choices"][0]["finish_reason"] == "length"
            else:
                error = json.loads(events[-2])["error"]
                assert error["code"] == 503 and "shutting down" in error["message"], error
        code = server.proc.wait(20)
    finally:
        stopped = server.stop()
    assert code == 0 and stopped == 0

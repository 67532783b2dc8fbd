"""Acceptance: a killed worker turns /health to 503, ends open streams with an error event, and the
server exits (status 1) with every child gone, as vLLM's does."""
from http.client import HTTPConnection
import json
import os
import signal
import threading
import time

from tests.e2e.server import API_KEY, Server, http


def test_worker_death_is_reported_and_the_server_exits():
    server = Server()
    try:
        events, started = [], threading.Event()

        def stream():
            conn = HTTPConnection("127.0.0.1", server.port, timeout=60)
            conn.request("POST", "/v1/completions", json.dumps({"prompt": "Count:", "max_tokens": 900, "stream": True,
                                                                "ignore_eos": True}),
                         {"Content-Type": "application/json", "Authorization": f"Bearer {API_KEY}"})
            resp = conn.getresponse()
            for raw in resp:
                line = raw.decode().strip()
                if line.startswith("data: "):
                    events.append(line[6:])
                    started.set()

        reader = threading.Thread(target=stream, daemon=True)
        reader.start()
        assert started.wait(60)
        os.kill(server.child_pid("worker0"), signal.SIGKILL)
        killed = time.monotonic()
        reader.join(10)
        assert events[-1] == "[DONE]"
        error = json.loads(events[-2])["error"]
        assert error["code"] == 503 and "dead" in error["message"]
        assert time.monotonic() - killed < 3
        assert http("GET", server.base_url + "/health").status_code == 503
        server.proc.wait(15)
    finally:
        code = server.stop()
    assert code == 1

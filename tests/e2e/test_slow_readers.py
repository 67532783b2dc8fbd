"""Flow control, from outside: streams whose clients never read are paused once their buffers fill (the
connection's kernel buffers, then --stream-backlog outputs), so they hold no place in the batch and a normal
request answers within twice its unloaded time; a paused stream whose client comes back to read resumes and
finishes whole; one whose client leaves is aborted at once; one whose client stays and never reads is
aborted after --stream-stall-timeout; and SIGTERM still stops the server, its never-read connections cut.
(The test's small buffers only make the streams pause sooner.)"""
from __future__ import annotations

import json
import socket
import statistics
import time

from tests.e2e.server import AUTH, Server, http

STREAMS = 32
MAX_TOKENS = 300
STALL_S = 8.0


def _normal(server: Server) -> float:
    start = time.monotonic()
    r = http("POST", server.base_url + "/v1/completions", {"prompt": "The capital of France is", "max_tokens": 32,
                                                            "temperature": 0, "ignore_eos": True}, headers=AUTH,
             timeout=60)
    assert r.status_code == 200, r.text
    return time.monotonic() - start


def _gauges(server: Server) -> tuple[float, float]:
    text = http("GET", server.base_url + "/metrics").text
    values = {}
    for line in text.splitlines():
        if line.startswith(("vllm:num_requests_running", "vllm:num_requests_waiting")):
            values[line.split("{")[0]] = float(line.split()[-1])
    return values["vllm:num_requests_running"], values["vllm:num_requests_waiting"]


def _never_read(port: int) -> socket.socket:
    """A streamed n=4 completion with 20 logprobs a token, sent and then never read."""
    body = json.dumps({"prompt": "Once upon a time", "max_tokens": MAX_TOKENS, "n": 4, "logprobs": 20,
                       "stream": True, "ignore_eos": True}).encode()
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", port))
    head = (f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: {AUTH['Authorization']}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n")
    sock.sendall(head.encode() + body)
    return sock


def _read_all(sock: socket.socket) -> list[dict]:
    """The rest of a stream, read at last: its events' data up to [DONE]."""
    sock.settimeout(60)
    data = b""
    while b"data: [DONE]" not in data:
        chunk = sock.recv(1 << 16)
        assert chunk, "the server closed the stream before [DONE]"
        data += chunk
    body = data.split(b"\r\n\r\n", 1)[1].decode(errors="replace")
    return [json.loads(line[6:]) for line in body.splitlines() if line.startswith("data: {")]


def test_never_read_streams_are_paused_then_dropped_and_do_not_slow_others():
    server = Server("--kv-cache-memory", str(512 << 20), "--send-buffer-bytes", "4096", "--stream-backlog", "4",
                    "--stream-stall-timeout", str(STALL_S), "--shutdown-timeout", "1")
    socks = []
    try:
        _normal(server)
        unloaded = statistics.median(_normal(server) for _ in range(3))
        socks = [_never_read(server.port) for _ in range(STREAMS)]
        deadline = time.monotonic() + 90
        while _gauges(server)[0] > 0:  # every stream's sequences paused (the normal requests are done)
            assert time.monotonic() < deadline, f"streams still running: {_gauges(server)}"
            time.sleep(0.5)
        paused_at = time.monotonic()
        running, waiting = _gauges(server)
        assert waiting == 4 * STREAMS, (running, waiting)
        loaded = statistics.median(_normal(server) for _ in range(3))
        assert loaded < 2 * unloaded, f"a normal request took {loaded:.2f} s, {unloaded:.2f} s unloaded"

        events = _read_all(socks.pop())  # a client that comes back: its request resumes and completes
        tokens = {i: 0 for i in range(4)}
        finish = {}
        for event in events:
            for choice in event["choices"]:
                tokens[choice["index"]] += len(choice["logprobs"]["tokens"]) if choice.get("logprobs") else 0
                finish[choice["index"]] = choice.get("finish_reason") or finish.get(choice["index"])
        assert tokens == {i: MAX_TOKENS for i in range(4)} and set(finish.values()) == {"length"}, (tokens, finish)

        socks.pop().close()  # a client that leaves: its paused request is aborted at once, not at the stall timeout
        left = time.monotonic()
        while _gauges(server)[1] > 4 * (STREAMS - 2):
            assert time.monotonic() - left < 3, f"a paused request outlived its client: {_gauges(server)}"
            time.sleep(0.2)

        while _gauges(server)[1] > 0:  # the others, never read: aborted after the stall timeout
            assert time.monotonic() - paused_at < STALL_S + 30, f"paused requests never dropped: {_gauges(server)}"
            time.sleep(0.5)
        assert time.monotonic() - paused_at > STALL_S / 2
    finally:
        stopped = server.stop()  # with the never-read connections still open
        for sock in socks:
            sock.close()
    assert stopped == 0

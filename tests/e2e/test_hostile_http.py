"""Acceptance (issue: any input, any fault): bad HTTP input gets a 4xx in the OpenAI shape, quickly, and
afterwards the server answers a normal request within a second with every process's memory bounded."""
from __future__ import annotations

import json
import socket
import threading
import time

import pytest

from tests.e2e.hostile import Bounded, kv_tokens
from tests.e2e.server import API_KEY, Server, http

AUTH = {"Authorization": f"Bearer {API_KEY}"}
READ_TIMEOUT = 2
CONNECTIONS = 32


@pytest.fixture(scope="module")
def server():
    s = Server("--request-read-timeout", str(READ_TIMEOUT), "--limit-concurrency", str(CONNECTIONS))
    yield s
    assert s.stop() == 0


@pytest.fixture(scope="module")
def bounded(server):
    def normal():
        r = post(server, "/v1/completions", {"prompt": "The capital of France is", "max_tokens": 2,
                                             "temperature": 0})
        assert r.status_code == 200, r.text
    def fill(prompt: str):
        r = post(server, "/v1/completions", {"prompt": prompt, "max_tokens": 1}, timeout=120)
        assert r.status_code == 200, r.text
    return Bounded(server.rss, normal, fill, fill_tokens=kv_tokens(server.output()))


def post(server, path, body=None, raw=None, headers=None, timeout=60):
    return http("POST", server.base_url + path, json_body=body, raw=raw, headers={**AUTH, **(headers or {})},
                timeout=timeout)


def assert_error(r, status, param=None, words=None):
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert error["code"] == status and error["message"]
    if param is not None:
        assert error["param"] == param, error
    if words is not None:
        assert words in error["message"], error


BIG_INTS = [
    ("/v1/completions", {"prompt": "hi", "n": 1_000_000_000, "max_tokens": 1}, "n"),
    ("/v1/completions", {"prompt": "hi", "n": 2 ** 70, "max_tokens": 1}, "n"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "n": 1_000_000_000}, "n"),
    ("/v1/completions", {"prompt": "hi", "n": 129, "max_tokens": 1}, "n"),  # over max_n, under the ceiling
    ("/v1/completions", {"prompt": "hi", "seed": 2 ** 70}, "seed"),
    ("/v1/completions", {"prompt": "hi", "seed": -2 ** 63 - 1}, "seed"),
    ("/v1/completions", {"prompt": "hi", "top_k": 2 ** 70}, "top_k"),
    ("/v1/completions", {"prompt": "hi", "top_k": 2 ** 64 - 1}, "top_k"),
    ("/v1/completions", {"prompt": "hi", "max_tokens": 10 ** 7}, "max_tokens"),
    ("/v1/completions", {"prompt": "hi", "stop_token_ids": [2 ** 70]}, "stop_token_ids"),
    ("/v1/completions", {"prompt": [[1, 2 ** 70]]}, "prompt_token_ids"),
]


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("path,body,param", BIG_INTS)
def test_out_of_range_integers_are_a_400_streamed_or_not(server, bounded, path, body, param, stream):
    start = time.monotonic()
    r = post(server, path, {**body, "stream": stream})
    assert time.monotonic() - start < 2
    assert_error(r, 400, param)
    bounded.check(f"{param}={body.get(param)}")


SURROGATES = [
    ("/v1/completions", {"prompt": "a\ud800"}),
    ("/v1/completions", {"prompt": ["ok", "\udc00"]}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "\udc00\ud800"}]}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "text", "text": "x\ud800"}]}]}),
    ("/v1/completions", {"prompt": "hi", "stop": ["\ud800"]}),
    ("/v1/completions", {"prompt": "hi", "model": "m\ud800"}),
    ("/tokenize", {"prompt": "a\ud800"}),
    ("/tokenize", {"messages": [{"role": "user", "content": "\udc00"}]}),
]


@pytest.mark.parametrize("path,body", SURROGATES)
def test_lone_surrogates_are_a_400(server, bounded, path, body):
    r = post(server, path, raw=json.dumps(body).encode())  # json.dumps writes them as \ud800 escapes
    assert_error(r, 400, words="surrogate")
    bounded.check(f"a lone surrogate at {path}")


def test_a_huge_prompt_is_refused_at_once_and_memory_comes_back(server, bounded):
    for size in (3 << 20, 3 << 20):  # under the body limit: the length check refuses it untokenized
        start = time.monotonic()
        r = post(server, "/v1/completions", {"prompt": "word " * (size // 5)})
        assert time.monotonic() - start < 2
        assert_error(r, 400, "prompt", "maximum context length")
        bounded.check("a 3 MB prompt")
    for _ in range(3):  # under the length bound: tokenized on the thread, then refused; memory comes back
        r = post(server, "/v1/completions", {"prompt": "word " * 30_000})
        assert_error(r, 400, "prompt", "maximum context length")
        bounded.check("a 150 kB prompt, tokenized")
    r = post(server, "/v1/chat/completions", {"messages": [{"role": "user", "content": "word " * (600 << 10)}]})
    assert_error(r, 400, "messages")
    bounded.check("a 3 MB chat message")


def test_a_body_over_the_limit_is_a_413(server, bounded):
    start = time.monotonic()
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:  # answered before the body
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + API_KEY.encode()
                  + b"\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % (20 << 20))
        _, reply = _closed_within(s, 5)
    assert reply.startswith(b"HTTP/1.1 413") and b"max-request-body-bytes" in reply, reply
    assert time.monotonic() - start < 2
    bounded.check("a 20 MB body")
    # without a Content-Length (chunked), refused once the bytes pass the limit
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + API_KEY.encode()
                  + b"\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n")
        chunk = b"a" * (1 << 20)
        try:
            for _ in range(6):
                s.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        except OSError:
            pass  # the server may close as soon as it answered
        assert _closed_within(s, 5)[1].startswith(b"HTTP/1.1 413")
    bounded.check("a chunked body over the limit")


def sse_chunks(r) -> list[dict]:
    assert r.status_code == 200, r.text
    lines = [line[6:] for line in r.text.split("\n") if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(line) for line in lines[:-1]]


def test_streamed_n_samples_finish_once_each(server, bounded):
    body = {"prompt": ["a", "b"], "n": 3, "max_tokens": 4, "temperature": 1.0, "seed": 1, "stream": True}
    chunks = sse_chunks(post(server, "/v1/completions", body))
    finishes = [c["choices"][0]["index"] for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
    assert sorted(finishes) == list(range(6))
    for index in range(6):  # nothing for a choice after its finish
        mine = [c for c in chunks if c["choices"] and c["choices"][0]["index"] == index]
        assert mine[-1]["choices"][0]["finish_reason"] is not None
    body = {"messages": [{"role": "user", "content": "hi"}], "n": 3, "max_tokens": 4, "seed": 1, "stream": True}
    chunks = sse_chunks(post(server, "/v1/chat/completions", body))
    finishes = [c["choices"][0]["index"] for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
    assert sorted(finishes) == [0, 1, 2]
    for stream, path, extra in ((False, "/v1/completions", {"prompt": ["a", "b"]}),
                                (False, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]})):
        r = post(server, path, {**extra, "n": 3, "max_tokens": 4, "seed": 1})
        choices = r.json()["choices"]
        assert sorted(c["index"] for c in choices) == list(range(len(choices)))
        assert all(c["finish_reason"] == "length" for c in choices)
    bounded.check("n > 1 streams")


STRICT = [
    ("/v1/completions", b'{"prompt": "hi", "temperature": Infinity}', "temperature"),
    ("/v1/completions", b'{"prompt": "hi", "top_p": NaN}', "top_p"),
    ("/v1/chat/completions", b'{"messages": [{"role": "user"}]}', "messages.0"),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "hi"}], "tools": "x"}', "tools"),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "hi"}], "response_format": "x"}',
     "response_format"),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "hi"}], "stream_options": '
                             b'{"include_usage": true}}', None),
    ("/v1/completions", b'{"prompt": "hi", "stream_options": {"include_usage": true}}', None),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "hi"}], "tool_choice": "auto", '
                             b'"tools": [{"type": "function", "function": {"name": "f"}}]}', "tool_choice"),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "hi"}], '
                             b'"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}', None),
    ("/v1/completions", b'{"prompt": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", None),  # nested too deep
    ("/v1/completions", b'{"prompt": [' + b",".join([b"[1]"] * 3000) + b"]}", "prompt"),  # 3000 prompts
    ("/v1/chat/completions", b'{"messages": [' + b",".join([b'{"role": "user", "content": ""}'] * 5000) + b"]}",
     "messages"),
]


@pytest.mark.parametrize("path,raw,param", STRICT)
def test_the_schema_is_as_strict_as_vllms(server, bounded, path, raw, param):
    r = post(server, path, raw=raw)
    assert r.status_code == 400, r.text
    if param is not None:
        assert (r.json()["error"]["param"] or "").startswith(param), r.json()
    bounded.check(f"{raw[:60]!r}")


def test_a_streamed_request_the_engine_refuses_is_a_plain_400(server, bounded):
    """The engine's own refusal (a request id already streaming) comes before any 200."""
    results = []
    body = {"messages": [{"role": "user", "content": "go"}], "max_tokens": 300, "ignore_eos": True, "stream": True}
    first = threading.Thread(target=lambda: results.append(
        post(server, "/v1/chat/completions", body, headers={"X-Request-Id": "same-id"}, timeout=180)))
    first.start()
    time.sleep(1.0)
    r = post(server, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "stream": True},
             headers={"X-Request-Id": "same-id"})
    assert_error(r, 400, words="already")
    first.join(120)
    chunks = sse_chunks(results[0])  # the first one ran to its end, untouched by the refusal
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    bounded.check("a refused stream")


def _closed_within(sock: socket.socket, seconds: float) -> tuple[bool, bytes]:
    sock.settimeout(seconds)
    data = b""
    try:
        while True:
            got = sock.recv(65536)
            if not got:
                return True, data
            data += got
    except socket.timeout:
        return False, data
    except ConnectionResetError:
        return True, data


def test_slow_and_silent_connections_are_closed(server, bounded):
    silent = socket.create_connection(("127.0.0.1", server.port))
    slow = socket.create_connection(("127.0.0.1", server.port))
    head = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
    start = time.monotonic()
    closed = False
    for byte in head:  # one byte a second: the head never completes in time
        try:
            slow.sendall(bytes([byte]))
        except OSError:  # closed by the server
            closed = True
            break
        time.sleep(1.0)
    closed = closed or _closed_within(slow, READ_TIMEOUT + 3)[0]
    assert closed and time.monotonic() - start < READ_TIMEOUT + 6
    closed, _ = _closed_within(silent, 1)
    assert closed
    short = socket.create_connection(("127.0.0.1", server.port))
    short.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + API_KEY.encode()
                  + b"\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{\"prompt\"")
    closed, data = _closed_within(short, READ_TIMEOUT + 3)
    assert data.startswith(b"HTTP/1.1 408"), data[:200]
    for s in (silent, slow, short):
        s.close()
    bounded.check("slow connections")


def test_connections_beyond_the_limit_get_a_503(server, bounded):
    idle = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(CONNECTIONS)]
    try:
        time.sleep(0.2)
        r = post(server, "/v1/completions", {"prompt": "hi", "max_tokens": 1})
        assert r.status_code == 503
    finally:
        for s in idle:
            s.close()
    time.sleep(0.5)
    bounded.check("connections beyond the limit")


def test_a_requests_own_chat_template_is_refused_without_the_opt_in(server, bounded):
    r = post(server, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1,
                                              "chat_template": "{% for i in range(10**9) %}x{% endfor %}"})
    assert_error(r, 400, "chat_template", "--trust-request-chat-template")
    bounded.check("a request's own chat template")


BOMBS = [("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", ("within 2 s",)),
         ("{% set a = [0] * 5000 %}{% for i in a %}{{ a|join(',') }}{% endfor %}",  # (50 MB: either, here)
          ("within 2 s", "more than the prompt may hold")),
         ("{{ 'x ' * 25000000 }}", ("more than the prompt may hold",)),
         ("{% set a = 'x' * 100000000 %}{{ (a ~ a ~ a ~ a ~ a ~ a ~ a ~ a)|length }}", ("MiB of memory",))]


@pytest.mark.time_limit(600)
def test_a_trusted_template_renders_within_its_budget_and_others_keep_being_served():
    """With the opt-in, every render still runs in its own process within --chat-template-seconds and
    --chat-template-memory, and its text within the prompt's length, before anything is tokenized."""
    # (2 s: time enough, on a loaded host, for the bombs that the memory or length bound stops first)
    s = Server("--trust-request-chat-template", "--chat-template-seconds", "2", "--chat-template-memory",
               str(256 << 20))
    try:
        idle = s.rss()
        for template, words in BOMBS:
            start = time.monotonic()
            r = post(s, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1,
                                                 "chat_template": template})
            assert_error(r, 400, "messages")
            assert any(w in r.json()["error"]["message"] for w in words), r.text
            assert time.monotonic() - start < 4.0, template
            r = post(s, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
            assert r.status_code == 200, r.text
        r = post(s, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
                                             "chat_template": "{% for m in messages %}{{ m.content }}{% endfor %}"})
        assert r.status_code == 200 and r.json()["usage"]["prompt_tokens"] == 1, r.text
        now = s.rss()
        assert all(now[name] < 1.2 * size for name, size in idle.items() if name in now), (idle, now)
    finally:
        assert s.stop() == 0


@pytest.mark.parametrize("n", [128, 3])
def test_a_fan_out_past_the_queue_is_a_400_at_once(server, bounded, n):
    """2048 prompts x n 128 (262,144 sequences) queued ahead of everyone for minutes; now refused unread."""
    start = time.monotonic()
    r = post(server, "/v1/completions", {"prompt": ["hi"] * 2048, "n": n, "max_tokens": 1})
    assert time.monotonic() - start < 2
    assert_error(r, 400, "prompt", "more than this server queues at once (--max-waiting-seqs 4096)")
    bounded.check("a fan-out of prompts x n")


def _gauge(server, name: str) -> float:
    text = http("GET", server.base_url + "/metrics", timeout=10).text
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name + "{"))


def _until(condition, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "the engine did not get there"
        time.sleep(0.1)


def test_a_full_queue_is_a_503_with_retry_after_and_drains():
    s = Server("--max-num-seqs", "1", "--max-waiting-seqs", "2")
    try:
        long = {"prompt": "Count:", "max_tokens": 150, "ignore_eos": True}
        results = []
        threads = [threading.Thread(target=lambda: results.append(post(s, "/v1/completions", long, timeout=300)))
                   for _ in range(3)]  # one running, two waiting
        threads[0].start()
        _until(lambda: _gauge(s, "vllm:num_requests_running") == 1)
        for t in threads[1:]:
            t.start()
        _until(lambda: _gauge(s, "vllm:num_requests_waiting") == 2)
        r = post(s, "/v1/completions", {"prompt": "hi", "max_tokens": 1})
        assert_error(r, 503, None, "queue is full")
        assert r.headers["retry-after"] == "1"
        for t in threads:
            t.join(300)
        assert [x.status_code for x in results] == [200, 200, 200]
        assert post(s, "/v1/completions", {"prompt": "hi", "max_tokens": 1}).status_code == 200
    finally:
        assert s.stop() == 0

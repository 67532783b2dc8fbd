"""Acceptance: a raw pyzmq + msgspec client, written from docs/protocol.md alone, against serve-zmq.

Imports nothing from the project on purpose.
"""
import os
import signal
import socket
import subprocess
import sys
import time

import msgspec
import psutil
import pytest
import zmq


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server():
    address = f"tcp://127.0.0.1:{free_port()}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "actorserve.cli", "serve-zmq", "--address", address, "--max-model-len", "1024",
         "--kv-cache-memory", str(64 << 20)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    deadline = time.monotonic() + 120
    line = b""
    while time.monotonic() < deadline and b"serving" not in line:
        line = proc.stdout.readline()
        if not line and proc.poll() is not None:
            pytest.fail("serve-zmq exited during start-up")
    children = [c.pid for c in psutil.Process(proc.pid).children(recursive=True)]
    yield address, proc
    proc.send_signal(signal.SIGTERM)
    proc.wait(10)
    assert proc.returncode == 0
    time.sleep(0.5)
    assert not [p for p in children if psutil.pid_exists(p) and psutil.Process(p).status() != "zombie"]


@pytest.fixture
def sock(server):
    ctx = zmq.Context()
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.setsockopt(zmq.RCVTIMEO, 60_000)
    s.connect(server[0])
    yield s
    s.close()
    ctx.term()


def send(sock, msg):
    sock.send(msgspec.msgpack.encode(msg))


def recv(sock):
    return msgspec.msgpack.decode(sock.recv_multipart()[0])


def stream(sock, request_id):
    text, tokens, last = "", [], None
    while True:
        msg = recv(sock)
        assert msg["type"] in ("request_output", "error"), msg
        if msg["type"] == "error":
            return msg, None, None
        assert msg["request_id"] == request_id
        for sample in msg["samples"]:
            text += sample["text"]
            tokens += sample["token_ids"]
            last = sample
        if msg["finished"]:
            return last, text, tokens


def test_raw_client_streams_the_reference_generation(sock, greedy_reference):
    ref = greedy_reference["prompts"][0]
    send(sock, {"type": "add_request", "request_id": "r1", "prompt": ref["templated_prompt"],
                "params": {"temperature": 0, "max_tokens": 64}})
    last, text, tokens = stream(sock, "r1")
    assert text == ref["output_text"] and tokens == ref["output_ids"]
    assert last["finish_reason"] == "stop"


def test_token_ids_logprobs_and_n(sock, greedy_reference):
    ref = greedy_reference["prompts"][1]
    send(sock, {"type": "add_request", "request_id": "r2", "prompt_token_ids": ref["prompt_ids"],
                "params": {"temperature": 0, "max_tokens": 5, "logprobs": 2}})
    got = []
    while True:
        msg = recv(sock)
        for s in msg["samples"]:
            got += s["logprobs"]
        if msg["finished"]:
            break
    assert [entry[0][0] for entry in got] == ref["output_ids"][:5]  # the sampled token comes first
    assert all(entry[0][2] == 1 for entry in got)  # greedy: rank 1
    send(sock, {"type": "add_request", "request_id": "r3", "prompt": "Once upon a time",
                "params": {"n": 2, "temperature": 1.0, "seed": 5, "max_tokens": 4}})
    seen = set()
    while True:
        msg = recv(sock)
        seen |= {s["index"] for s in msg["samples"]}
        if msg["finished"]:
            break
    assert seen == {0, 1}


def test_prompt_logprobs_come_with_the_first_message(sock, greedy_reference):
    ids = greedy_reference["prompts"][1]["prompt_ids"]
    send(sock, {"type": "add_request", "request_id": "p1", "prompt_token_ids": ids,
                "params": {"temperature": 0, "max_tokens": 3, "prompt_logprobs": 1}})
    messages = []
    while not (messages and messages[-1]["finished"]):
        messages.append(recv(sock))
    first = messages[0]["prompt_logprobs"]
    assert len(first) == len(ids) and first[0] is None
    assert all(entry[0][0] == token and entry[0][2] >= 1 and len(entry) <= 2
               for entry, token in zip(first[1:], ids[1:]))
    assert all(m.get("prompt_logprobs") is None for m in messages[1:])


@pytest.mark.parametrize("frames", [
    [b"\x00\xffnot msgpack"],
    [msgspec.msgpack.encode({"type": "launch_missiles"})],
    [msgspec.msgpack.encode({"type": "add_request", "request_id": 7, "params": {}})],
    [msgspec.msgpack.encode([1, 2, 3])],
    [msgspec.msgpack.encode({"type": "health_ping", "nonce": 1}), b"junk", b"more"],
])
def test_garbage_gets_an_error_and_the_server_serves_on(sock, frames):
    sock.send_multipart(frames)
    reply = recv(sock)
    assert reply["type"] == "error" and reply["kind"] == "ProtocolError" and reply["message"]
    send(sock, {"type": "health_ping", "nonce": 42})
    pong = recv(sock)
    assert pong == {**pong, "type": "health_pong", "nonce": 42}


@pytest.mark.parametrize("params,field", [({"top_p": 2.0}, "top_p"), ({"stop_token_ids": [49152]}, "stop_token_ids"),
                                          ({"max_tokens": -1}, "max_tokens")])
def test_bad_parameters_are_refused_by_name(sock, params, field):
    send(sock, {"type": "add_request", "request_id": "bad", "prompt": "hi", "params": params})
    reply = recv(sock)
    assert reply["type"] == "error" and reply["kind"] == "ValueError" and reply["request_id"] == "bad"
    assert field in reply["message"]


def test_version_mismatch_and_abort(sock):
    send(sock, {"type": "add_request", "request_id": "v", "prompt": "hi", "params": {}, "version": 99})
    reply = recv(sock)
    assert reply["kind"] == "ValueError" and "version" in reply["message"]
    send(sock, {"type": "add_request", "request_id": "long", "prompt": "Count to a thousand:",
                "params": {"max_tokens": 500, "ignore_eos": True}})
    recv(sock)
    send(sock, {"type": "abort_request", "request_id": "long"})
    while True:
        msg = recv(sock)
        if msg["finished"]:
            break
    assert msg["samples"][-1]["finish_reason"] == "abort"

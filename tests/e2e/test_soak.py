"""Acceptance (issue: any input, any fault): a soak of mixed good and bad HTTP and ZMQ traffic from 32
concurrent clients, with random disconnects and ZMQ messages of too many frames, two more clients whose
streams are never read, and one worker SIGKILL (after which the test restarts the
server on the same ports). Nothing is lost that was not refused: every good request completes with
the right text, or fails with an explicit error while the engine is down; no 500, no hang. Resident
memory stays flat, and at the end the engine holds no request and no KV block.

ACTORSERVE_SOAK_S sets the length (60 s in ``make test``; ``make soak`` runs the issue's 5 minutes, and
judges too that a normal request answers within 2 s at the 99th percentile); ACTORSERVE_SOAK_REPORT names a
JSON file for the figures.
"""
from __future__ import annotations

import collections
import json
import os
import random
import signal
import socket
import threading
import time
from http.client import HTTPConnection

import msgspec
import psutil
import pytest
import zmq

from tests.e2e.server import API_KEY, Server, free_port, http

DURATION = float(os.environ.get("ACTORSERVE_SOAK_S", "60"))
HTTP_CLIENTS, ZMQ_CLIENTS, UNREAD_CLIENTS = 24, 8, 2
PROMPTS = ["The capital of France is", "1, 2, 3, 4,", "Water is made of", "The opposite of hot is"]
AUTH = {"Authorization": f"Bearer {API_KEY}", "Content-Type": "application/json"}
pack, unpack = msgspec.msgpack.encode, msgspec.msgpack.decode

BAD_HTTP = [
    {"prompt": "hi", "n": 10 ** 9}, {"prompt": "hi", "seed": 2 ** 70}, {"prompt": "a\ud800"},
    {"prompt": "hi", "max_tokens": 10 ** 7}, {"messages": [{"role": "user"}]}, {"prompt": "x " * 300_000},
    {"prompt": [[1, 2 ** 40]]}, {"prompt": "hi", "temperature": -1},
    # the classes of vLLM's 2025-26 advisories: fan-out, a request's own template, overflowing floats
    {"prompt": ["hi"] * 2048, "n": 128, "max_tokens": 1},
    {"messages": [{"role": "user", "content": "hi"}], "chat_template": "{% for i in range(10**9) %}x{% endfor %}"},
    {"prompt": "hi", "use_beam_search": True, "n": 2, "max_tokens": 2, "length_penalty": 1e308},
    {"prompt": "hi", "min_tokens": 10 ** 9}, {"prompt": "hi", "top_p": float("nan")},
]
BAD_ZMQ = [
    [pack({"type": "health_ping", "nonce": 1}), pack([[0, "float32", [-1, -2]]]), b"\0" * 8],
    [b"\x91" * 100_000 + b"\xc0"],
    [pack({"type": "add_request", "request_id": "bad", "prompt": "hi", "params": {"n": 2 ** 62}})],
    [pack({"type": "add_request", "request_id": "bad", "prompt": "hi", "params": {"nope": 1}})],
    [pack({"type": "shutdown", "reason": "stranger"})],
    [pack({"type": "add_request", "request_id": "bad", "prompt": "hi", "params": {"min_tokens": 10 ** 9}})],
]


class Tally:
    def __init__(self) -> None:
        self.counts = collections.Counter()
        self.lost: list[str] = []
        self.lock = threading.Lock()
        self.outages: list[list[float]] = []  # [kill, back up] in time.monotonic()
        self.normal: list[tuple[float, float]] = []  # each good request's (start, seconds)

    def add(self, what: str) -> None:
        with self.lock:
            self.counts[what] += 1

    def failed(self, what: str, started: float, detail: str) -> None:
        """An explicit failure is fine while the engine is down; anything else is a loss."""
        now = time.monotonic()
        with self.lock:
            if any(kill - 1 <= now and started <= back + 2 for kill, back in self.outages):
                self.counts[f"{what}: failed in the outage"] += 1
            else:
                self.lost.append(f"{what}: {detail}")


def completion(port: int, body: dict, timeout: float = 60):
    conn = HTTPConnection("127.0.0.1", port, timeout=timeout)
    conn.request("POST", "/v1/completions" if "prompt" in body else "/v1/chat/completions",
                 json.dumps(body), AUTH)
    return conn, conn.getresponse()


def http_client(port: int, expected: dict, tally: Tally, until: float, seed: int) -> None:
    rng = random.Random(seed)
    while time.monotonic() < until:
        started = time.monotonic()
        kind = rng.choices(["good", "stream", "bad", "disconnect"], [3, 3, 3, 1])[0]
        prompt = rng.choice(PROMPTS)
        try:
            if kind == "bad":
                conn, resp = completion(port, rng.choice(BAD_HTTP))
                status = resp.status
                resp.read()
                if 400 <= status < 500:
                    tally.add("http bad: refused")
                elif status == 503:
                    tally.failed("http bad", started, "503")
                else:
                    tally.lost.append(f"http bad: status {status}")
            elif kind == "good":
                conn, resp = completion(port, {"prompt": prompt, "max_tokens": 8, "temperature": 0})
                body = resp.read()
                if resp.status == 200 and json.loads(body)["choices"][0]["text"] == expected[prompt]:
                    tally.add("http good: right")
                    with tally.lock:
                        tally.normal.append((started, time.monotonic() - started))
                elif resp.status == 503:
                    tally.failed("http good", started, "503")
                else:
                    tally.lost.append(f"http good: {resp.status} {body[:200]!r}")
            elif kind == "stream":
                conn, resp = completion(port, {"prompt": prompt, "max_tokens": 8, "temperature": 0, "stream": True})
                text, events = "", [line.decode().strip()[6:] for line in resp if line.startswith(b"data: ")]
                errors = [e for e in events[:-1] if "error" in json.loads(e)]
                text = "".join(json.loads(e)["choices"][0]["text"] for e in events[:-1] if not errors)
                if resp.status == 200 and events[-1] == "[DONE]" and not errors and text == expected[prompt]:
                    tally.add("http stream: right")
                elif resp.status == 503 or (errors and json.loads(errors[0])["error"]["code"] == 503):
                    tally.failed("http stream", started, "503")
                else:
                    tally.lost.append(f"http stream: {resp.status} {events[-3:]}")
            else:
                conn, resp = completion(port, {"prompt": prompt, "max_tokens": 200, "ignore_eos": True, "stream": True})
                resp.fp.readline()
                tally.add("http disconnect")
            conn.close()
        except (ConnectionError, socket.timeout, OSError) as exc:
            tally.failed(f"http {kind}", started, repr(exc))
            time.sleep(0.2)


def unread_client(port: int, tally: Tally, until: float, seed: int) -> None:
    """Streams of n 4 with 20 logprobs a token that their client never reads: each is held open 40-60 s (its
    request paused once the buffers fill), then dropped."""
    rng = random.Random(seed)
    while time.monotonic() < until:
        started = time.monotonic()
        try:
            conn, _ = completion(port, {"prompt": rng.choice(PROMPTS), "max_tokens": 300, "ignore_eos": True,
                                        "stream": True, "n": 4, "logprobs": 20})
            time.sleep(min(rng.uniform(40, 60), max(0.0, until - time.monotonic())))
            conn.close()
            tally.add("http unread stream")
        except (ConnectionError, socket.timeout, OSError) as exc:
            tally.failed("http unread", started, repr(exc))
            time.sleep(0.2)


def zmq_client(ctx, address: str, expected: dict, tally: Tally, until: float, seed: int) -> None:
    rng = random.Random(seed)
    sock = None
    n = 0
    while time.monotonic() < until:
        if sock is None:
            sock = ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.RCVTIMEO, 20_000)
            sock.connect(address)
        started = time.monotonic()
        kind = rng.choices(["good", "bad", "disconnect", "frames"], [5, 3, 1, 1])[0]
        n += 1
        try:
            if kind == "bad":
                sock.send_multipart(rng.choice(BAD_ZMQ))
                reply = unpack(sock.recv_multipart()[0])
                assert reply["type"] == "error", reply
                tally.add("zmq bad: refused")
            elif kind == "good":
                prompt = rng.choice(PROMPTS)
                sock.send(pack({"type": "add_request", "request_id": f"g{n}", "prompt": prompt,
                                "params": {"temperature": 0, "max_tokens": 8}}))
                text = ""
                while True:
                    msg = unpack(sock.recv_multipart()[0])
                    if msg["type"] == "error":
                        raise RuntimeError(msg)
                    text += "".join(s["text"] for s in msg["samples"])
                    if msg["finished"]:
                        break
                if text == expected[prompt]:
                    tally.add("zmq good: right")
                else:
                    tally.lost.append(f"zmq good: {text!r} for {prompt!r}")
            elif kind == "frames":  # more frames than a client message has: refused, and the connection closed
                sock.send_multipart([pack({"type": "health_ping", "nonce": 1})] + [b"\0" * (64 << 10)] * 63)
                reply = unpack(sock.recv_multipart()[0])
                assert reply["type"] == "error" and reply["kind"] == "ProtocolError", reply
                sock.close()
                sock = None
                tally.add("zmq frames: refused")
            else:
                sock.send(pack({"type": "add_request", "request_id": f"d{n}", "prompt": "Once upon",
                                "params": {"max_tokens": 300, "ignore_eos": True}}))
                sock.close()
                sock = None
                tally.add("zmq disconnect")
        except (zmq.Again, RuntimeError, AssertionError) as exc:
            tally.failed(f"zmq {kind}", started, repr(exc)[:200])
            sock.close()
            sock = None
    if sock is not None:
        sock.close()


def rss(server: Server) -> dict[str, int]:
    try:
        return server.rss()
    except psutil.NoSuchProcess:
        return {}


@pytest.mark.time_limit(DURATION + 300)  # the run, the server's start and stop
def test_soak():
    port, zport = free_port(), free_port()
    address = f"tcp://127.0.0.1:{zport}"
    flags = ("--zmq-address", address, "--max-num-seqs", "64")
    server = Server(*flags, port=port)
    expected = {p: http("POST", server.base_url + "/v1/completions",
                        {"prompt": p, "max_tokens": 8, "temperature": 0},
                        headers=AUTH).json()["choices"][0]["text"] for p in PROMPTS}
    tally, ctx = Tally(), zmq.Context()
    until = time.monotonic() + DURATION
    threads = [threading.Thread(target=http_client, args=(port, expected, tally, until, i))
               for i in range(HTTP_CLIENTS)]
    threads += [threading.Thread(target=zmq_client, args=(ctx, address, expected, tally, until, 100 + i))
                for i in range(ZMQ_CLIENTS)]
    threads += [threading.Thread(target=unread_client, args=(port, tally, until, 200 + i))
                for i in range(UNREAD_CLIENTS)]
    for t in threads:
        t.start()
    samples: list[list[dict]] = [[]]
    kill_at = time.monotonic() + 0.4 * DURATION
    try:
        while time.monotonic() < until:
            time.sleep(min(5.0, DURATION / 12))
            samples[-1].append(rss(server))
            if kill_at is not None and time.monotonic() > kill_at:
                kill_at = None
                with tally.lock:
                    tally.outages.append([time.monotonic(), float("inf")])
                os.kill(server.child_pid("worker0"), signal.SIGKILL)
                assert server.proc.wait(20) == 1
                assert server.stop() == 1
                server = Server(*flags, port=port)
                with tally.lock:
                    tally.outages[-1][1] = time.monotonic()
                samples.append([])
        for t in threads:
            t.join(90)
        assert not any(t.is_alive() for t in threads), "a client hung"
        time.sleep(1.0)
        ctl = ctx.socket(zmq.DEALER)
        ctl.setsockopt(zmq.RCVTIMEO, 10_000)
        ctl.connect(address)
        ctl.send(pack({"type": "health_ping", "nonce": 9}))
        pong = unpack(ctl.recv_multipart()[0])
        ctl.close(0)
        normal = sorted(s for start, s in tally.normal  # (those that met the worker's kill waited out its restart)
                        if not any(start < back and start + s > kill for kill, back in tally.outages))
        p99 = normal[int(0.99 * (len(normal) - 1))] if normal else None
        report = {"seconds": DURATION, "outage_s": [round(back - kill, 1) for kill, back in tally.outages],
                  "normal_p99_s": p99, "normal_median_s": normal[len(normal) // 2] if normal else None,
                  "counts": dict(tally.counts), "lost": tally.lost[:20],
                  "rss_mb": [[{k: round(v / 2 ** 20) for k, v in s.items()} for s in run] for run in samples],
                  "end": {"num_running": pong["num_running"], "num_waiting": pong["num_waiting"],
                          "kv_cache_usage": pong["kv_cache_usage"]}}
        if os.environ.get("ACTORSERVE_SOAK_REPORT"):
            with open(os.environ["ACTORSERVE_SOAK_REPORT"], "w") as f:
                json.dump(report, f, indent=1)
        assert not tally.lost, tally.lost[:20]
        for kind in ("http good: right", "http stream: right", "http bad: refused", "zmq good: right",
                     "zmq bad: refused"):
            assert tally.counts[kind] > 0, report
        assert pong["num_running"] == 0 and pong["num_waiting"] == 0 and pong["kv_cache_usage"] == 0, pong
        if DURATION >= 300:  # make soak: a normal request among the hostile ones, at the 99th percentile (the
            assert p99 < 2.0, report  # minute in make test is reported, not judged: a slower CPU's tail differs)
        for run in samples:  # flat: the last sample of each server within 20% of its first after warm-up
            run = [s for s in run if s]
            if len(run) >= 3:
                first, last = run[1], run[-1]
                grown = {k: (first[k], last[k]) for k in first if last.get(k, 0) > 1.2 * first[k]}
                assert not grown, report
    finally:
        ctx.term()
        server.stop()

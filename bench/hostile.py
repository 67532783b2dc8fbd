"""What a hostile request costs the server: time to its refusal, what the others see meanwhile, and the
memory each process holds after it, against idle.

Starts ``actorserve serve`` (HTTP, and the ZMQ protocol beside it) as a user would, measures each process's
idle RSS, then for each giant or abusive request: the time to its answer, the worst /health latency
while it was handled, and the RSS of every process once it was answered (after a second's rest). Prints
one JSON object.

    .venv/bin/python bench/hostile.py [-- extra serve flags]
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

import msgspec
import psutil
import zmq


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(url: str, body: bytes, timeout: float = 120) -> int:
    req = urllib.request.Request(url, data=body, method="POST", headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            r.read()
            return r.status
    except urllib.error.HTTPError as err:
        return err.code
    except OSError:
        return -1  # the server answered and closed before the whole body went out


def raw_status(port: int, length: int) -> int:
    """The status a request head announcing ``length`` bytes gets, before any of the body is sent."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n" % length)
        return int(s.recv(4096).split()[1])


def rss(proc: psutil.Process) -> dict[str, float]:
    sizes = {"frontend": proc.memory_info().rss}
    for child in proc.children(recursive=True):
        sizes[child.cmdline()[-1]] = child.memory_info().rss
    return {k: round(v / 2 ** 20) for k, v in sizes.items()}


def worst_health(base: str, stop: threading.Event, out: list) -> None:
    while not stop.is_set():
        start = time.monotonic()
        try:
            urllib.request.urlopen(base + "/health", timeout=120).read()
        except OSError:
            out.append(float("inf"))
            return
        out.append(time.monotonic() - start)
        time.sleep(0.05)


def measure(base: str, proc, name: str, send) -> dict:
    stop, lat = threading.Event(), []
    watcher = threading.Thread(target=worst_health, args=(base, stop, lat))
    watcher.start()
    start = time.monotonic()
    answer = send()
    took = time.monotonic() - start
    stop.set()
    watcher.join()
    time.sleep(1.0)
    return {"request": name, "answer": answer, "seconds": round(took, 3),
            "worst_health_s": round(max(lat, default=0.0), 3), "rss_mb_after": rss(proc)}


def main() -> None:
    port, zport = free_port(), free_port()
    extra = sys.argv[sys.argv.index("--") + 1:] if "--" in sys.argv else []
    log = tempfile.NamedTemporaryFile(prefix="actorserve-hostile-", suffix=".log")
    server = subprocess.Popen([sys.executable, "-m", "actorserve.cli", "serve", "--port", str(port),
                               "--zmq-address", f"tcp://127.0.0.1:{zport}", *extra],
                              stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        while b"actorserve: serving" not in open(log.name, "rb").read():
            assert server.poll() is None, open(log.name, "rb").read().decode()
            time.sleep(0.2)
        base = f"http://127.0.0.1:{port}"
        proc = psutil.Process(server.pid)
        for _ in range(3):
            post(base + "/v1/completions", b'{"prompt": "Hello", "max_tokens": 4}')
        time.sleep(1.0)
        idle = rss(proc)
        ctx = zmq.Context()
        sock = ctx.socket(zmq.DEALER)
        sock.connect(f"tcp://127.0.0.1:{zport}")

        def zmq_prompt(size: int, wait_s: float):
            def send():
                sock.send(msgspec.msgpack.encode({"type": "add_request", "request_id": str(size),
                                                  "prompt": "word " * (size // 5), "params": {}}))
                if sock.poll(int(wait_s * 1000)):
                    return msgspec.msgpack.decode(sock.recv_multipart()[0])["kind"]
                return "no answer (disconnected)"
            return send

        cases = [
            ("HTTP prompt, 1 MB (under the length bound: tokenized, then refused)",
             lambda: post(base + "/v1/completions", json.dumps({"prompt": "word " * (200 << 10)}).encode())),
            ("HTTP prompt, 3 MB", lambda: post(base + "/v1/completions",
                                               json.dumps({"prompt": "word " * (600 << 10)}).encode())),
            ("HTTP body, 20 MB (Content-Length)", lambda: raw_status(port, 20 << 20)),
            ("HTTP n = 10^9", lambda: post(base + "/v1/completions", b'{"prompt": "hi", "n": 1000000000}')),
            ("ZMQ prompt, 3 MB", zmq_prompt(3 << 20, 20.0)),
            ("ZMQ prompt, 30 MB (answer waited for 3 s)", zmq_prompt(30 << 20, 3.0)),
        ]
        results = [measure(base, proc, name, send) for name, send in cases]
        sock.close(0)
        ctx.term()
        print(json.dumps({"idle_rss_mb": idle, "cases": results}, indent=1))
    finally:
        server.terminate()
        server.wait(20)
        log.close()


if __name__ == "__main__":
    main()

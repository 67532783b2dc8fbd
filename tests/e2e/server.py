"""Start and stop a real ``actorserve serve`` on 127.0.0.1 for the end-to-end tests."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

import psutil

from actorserve.runtime.transport.addresses import free_ports

API_KEY = "test-key"
AUTH = {"Authorization": f"Bearer {API_KEY}"}


def free_port() -> int:
    return free_ports("127.0.0.1", 1)[0]


class Server:
    def __init__(self, *extra: str, api_key: str = API_KEY, port: int = None) -> None:
        self.port = port or free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        cmd = [sys.executable, "-m", "actorserve.cli", "serve", "--port", str(self.port), "--max-model-len", "1024",
               "--kv-cache-memory", str(96 << 20), "--api-key", api_key, *extra]
        # the log goes to a file: a pipe nobody reads would block the server once it filled
        self.log = tempfile.NamedTemporaryFile(prefix="actorserve-e2e-", suffix=".log", delete=False)
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT,
                                     env={**os.environ, "PYTHONUNBUFFERED": "1"})
        deadline = time.monotonic() + 180
        while b"actorserve: serving" not in self.output():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.proc.kill()
                raise RuntimeError(f"actorserve serve did not start:\n{self.output().decode(errors='replace')}")
            time.sleep(0.1)
        self.children = {p.pid for p in psutil.Process(self.proc.pid).children(recursive=True)}

    def output(self) -> bytes:
        with open(self.log.name, "rb") as f:
            return f.read()

    def rss(self) -> dict[str, int]:
        """Resident memory of the server and each child now running, by name (frontend, scheduler, worker0,
        the chat template's renderer...)."""
        server = psutil.Process(self.proc.pid)
        sizes = {"frontend": server.memory_info().rss}
        for child in server.children(recursive=True):
            try:
                sizes[child.cmdline()[-1]] = child.memory_info().rss
            except psutil.NoSuchProcess:
                pass  # (ended meanwhile)
        return sizes

    def child_pid(self, name: str) -> int:
        """worker0 or scheduler: the actor's name is the last word of its command line."""
        return next(pid for pid in self.children if psutil.Process(pid).cmdline()[-1] == name)

    def stop(self) -> int:
        if self.proc.poll() is None:
            try:  # (children started since: a chat template renderer that replaced one)
                self.children |= {p.pid for p in psutil.Process(self.proc.pid).children(recursive=True)}
            except psutil.NoSuchProcess:
                pass
            self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and any(_alive(p) for p in self.children):
            time.sleep(0.05)
        leftover = [p for p in self.children if _alive(p)]
        for pid in leftover:
            psutil.Process(pid).kill()
        self.log.close()
        os.unlink(self.log.name)
        assert not leftover, f"children outlived the server: {leftover}"
        return self.proc.returncode


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


class Reply:
    def __init__(self, status: int, headers, body: bytes) -> None:
        self.status_code = status
        self.headers = {k.lower(): v for k, v in headers.items()}
        self.content = body
        self.text = body.decode("utf-8", "replace")

    def json(self):
        return json.loads(self.content)


def http(method: str, url: str, json_body=None, raw: bytes = None, headers: dict = None, timeout: float = 120):
    """A plain HTTP call (stdlib only), returning status, headers and body whatever the status."""
    data = raw if raw is not None else (None if json_body is None else json.dumps(json_body).encode())
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json",
                                                                         **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return Reply(resp.status, resp.headers, resp.read())
    except urllib.error.HTTPError as err:
        return Reply(err.code, err.headers, err.read())


def read_stream(port: int, max_tokens: int, events: list, started) -> None:
    """A streamed completion of ``max_tokens`` (EOS ignored): each event's data appended to ``events`` as it
    comes, ``started`` (a threading.Event) set at the first; for a thread of the test's own."""
    import json as _json
    from http.client import HTTPConnection

    conn = HTTPConnection("127.0.0.1", port, timeout=60)
    conn.request("POST", "/v1/completions", _json.dumps({"prompt": "Count:", "max_tokens": max_tokens, "stream": True,
                                                         "ignore_eos": True}),
                 {"Content-Type": "application/json", **AUTH})
    for raw in conn.getresponse():
        line = raw.decode().strip()
        if line.startswith("data: "):
            events.append(line[6:])
            started.set()

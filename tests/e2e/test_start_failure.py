"""Start-up failures seen from outside: HTTP requests that wait for ``actorserve serve`` to start get a 503
in the OpenAI shape, /health is never 200 and the server exits 1; ZmqClient calls waiting on
``actorserve serve-zmq`` get EngineStartError. Each with eight concurrent callers, for a bad model path,
a worker killed while it loads and a scheduler killed while it loads."""
import asyncio
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import psutil
import pytest

from actorserve import EngineStartError, SamplingParams, ZmqClient
from tests.e2e.server import free_port, http

CALLERS = 8
BODY = {"model": "SmolLM2-135M-Instruct", "prompt": "Hello", "max_tokens": 4}


def start(*args: str, wait_for: bytes) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-m", "actorserve.cli", *args, "--max-model-len", "512",
                             "--kv-cache-memory", str(32 << 20)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if wait_for in line or (not line and proc.poll() is not None):
            return proc
    proc.kill()
    raise AssertionError(f"no {wait_for!r} from the server")


def kill_child(proc: subprocess.Popen, name: str) -> None:
    """SIGKILL the server's actor ``name`` as soon as it exists (it is then still loading)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        for child in psutil.Process(proc.pid).children(recursive=True):
            try:
                if child.cmdline()[-1:] == [name]:
                    os.kill(child.pid, signal.SIGKILL)
                    return
            except (psutil.NoSuchProcess, psutil.ZombieProcess):
                pass
        time.sleep(0.02)
    raise AssertionError(f"{name} never started")


def finish(proc: subprocess.Popen) -> int:
    try:
        return proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)


@pytest.mark.parametrize("fault", ["bad-path", "worker0", "scheduler"])
def test_http_requests_waiting_for_a_failed_start_get_503(fault, tmp_path):
    port = free_port()
    model = [str(tmp_path / "missing.gguf"), "--tokenizer", str(tmp_path)] if fault == "bad-path" else []
    proc = start("serve", *model, "--port", str(port), wait_for=b"listening")
    try:
        url = f"http://127.0.0.1:{port}"
        with ThreadPoolExecutor(CALLERS + 1) as pool:
            health = pool.submit(http, "GET", url + "/health")
            replies = [pool.submit(http, "POST", url + "/v1/completions", BODY, timeout=120) for _ in range(CALLERS)]
            if fault != "bad-path":
                kill_child(proc, fault)
            replies = [r.result() for r in replies]
        assert health.result().status_code == 503  # asked while starting: not 200
        for reply in replies:
            assert reply.status_code == 503, reply.text
            error = reply.json()["error"]
            assert error["type"] == "ServiceUnavailableError" and error["code"] == 503
            assert "failed to start" in error["message"]
        late = http("GET", url + "/health", timeout=10)
        assert late.status_code == 503
    finally:
        code = finish(proc)
    assert code == 1


@pytest.mark.parametrize("fault", ["bad-path", "worker0", "scheduler"])
def test_zmq_calls_waiting_for_a_failed_start_get_engine_start_error(fault, tmp_path):
    address = f"tcp://127.0.0.1:{free_port()}"
    model = ["--model", str(tmp_path / "missing.gguf")] if fault == "bad-path" else []
    proc = subprocess.Popen([sys.executable, "-m", "actorserve.cli", "serve-zmq", "--address", address, *model,
                             "--max-model-len", "512", "--kv-cache-memory", str(32 << 20)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    async def callers() -> list:
        client = ZmqClient(address, connect_timeout=5)  # the failed server never binds: the callers wait this long

        async def one():
            async for _ in client.generate([1, 2, 3], SamplingParams(max_tokens=4)):
                pass

        try:
            calls = [asyncio.ensure_future(one()) for _ in range(CALLERS)]
            if fault != "bad-path":
                await asyncio.get_running_loop().run_in_executor(None, kill_child, proc, fault)
            return await asyncio.wait_for(asyncio.gather(*calls, return_exceptions=True), 120)
        finally:
            await client.close()

    try:
        results = asyncio.run(callers())
    finally:
        code = finish(proc)
    assert all(isinstance(r, EngineStartError) for r in results), results
    assert code != 0

"""Acceptance: the ZMQ port's key (--api-key) and CurveZMQ (--curve-secret-key, --curve-authorized-keys),
from raw clients and from ZmqClient."""
from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import tempfile
import time

import msgspec
import pytest
import zmq
import zmq.auth

from actorserve import EngineStartError, SamplingParams, ZmqClient
from tests.e2e.server import free_port

KEY = "zmq-secret"
pack, unpack = msgspec.msgpack.encode, msgspec.msgpack.decode


def start(*flags: str):
    address = f"tcp://127.0.0.1:{free_port()}"
    log = tempfile.NamedTemporaryFile(prefix="actorserve-zmq-", suffix=".log")
    proc = subprocess.Popen([sys.executable, "-m", "actorserve.cli", "serve-zmq", "--address", address,
                             "--max-model-len", "512", "--kv-cache-memory", str(32 << 20), *flags],
                            stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    deadline = time.monotonic() + 120
    while b"serving" not in open(log.name, "rb").read():
        if proc.poll() is not None or time.monotonic() > deadline:
            text = open(log.name, "rb").read().decode()
            proc.kill()
            proc.wait()
            log.close()
            pytest.fail(f"the server did not start:\n{text}")
        time.sleep(0.1)
    return address, proc, log


def stop(proc, log) -> None:
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(15) == 0
    log.close()


def dealer(ctx, address, configure=None):
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.setsockopt(zmq.RCVTIMEO, 20_000)
    if configure is not None:
        configure(s)
    s.connect(address)
    return s


def add(request_id: str, **extra) -> bytes:
    return pack({"type": "add_request", "request_id": request_id, "prompt": "Hello",
                 "params": {"temperature": 0, "max_tokens": 2}, **extra})


@pytest.fixture(scope="module")
def keyed():
    address, proc, log = start("--api-key", KEY)
    yield address
    stop(proc, log)


def test_messages_without_the_key_get_an_error_and_no_work(keyed):
    ctx = zmq.Context()
    s = dealer(ctx, keyed)
    try:
        for message in (add("a"), add("b", api_key="wrong"), pack({"type": "health_ping", "nonce": 3}),
                        pack({"type": "abort_request", "request_id": "a"})):
            s.send(message)
            reply = unpack(s.recv_multipart()[0])
            assert reply["type"] == "error" and reply["kind"] == "AuthenticationError", reply
        s.send(pack({"type": "health_ping", "nonce": 4, "api_key": KEY}))
        pong = unpack(s.recv_multipart()[0])
        assert pong["type"] == "health_pong" and pong["num_running"] == 0 and pong["num_waiting"] == 0
        s.send(add("c", api_key=KEY))
        while True:
            reply = unpack(s.recv_multipart()[0])
            assert reply["type"] == "request_output", reply
            if reply["finished"]:
                break
    finally:
        s.close()
        ctx.term()


def test_zmq_client_sends_its_key(keyed):
    async def main():
        good, bad = ZmqClient(keyed, api_key=KEY), ZmqClient(keyed)
        try:
            outs = [o async for o in good.generate("Hello", SamplingParams(temperature=0, max_tokens=2))]
            assert outs[-1].finished and len(outs[-1].outputs[0].token_ids) == 2
            assert (await good.check_health()).num_running == 0
            with pytest.raises(PermissionError):
                async for _ in bad.generate("Hello", SamplingParams(max_tokens=2)):
                    pass
            with pytest.raises(PermissionError):
                await bad.check_health()
        finally:
            await good.close()
            await bad.close()
    asyncio.run(main())


def test_curve_admits_only_authorized_keys(tmp_path):
    keys, allowed, strangers = tmp_path / "keys", tmp_path / "allowed", tmp_path / "strangers"
    for d in (keys, allowed, strangers):
        d.mkdir()
    server_public, server_secret = zmq.auth.create_certificates(keys, "server")
    client_public, client_secret = zmq.auth.create_certificates(keys, "client")
    _, stranger_secret = zmq.auth.create_certificates(strangers, "stranger")
    os.rename(client_public, allowed / "client.key")
    address, proc, log = start("--curve-secret-key", server_secret, "--curve-authorized-keys", str(allowed))
    try:
        raw_clients_get_nothing(address, server_public, stranger_secret)

        async def main():
            stranger = ZmqClient(address, curve_server_key=server_public, curve_client_key=stranger_secret)
            wrong_server = ZmqClient(address, curve_server_key=client_public_in(allowed),
                                     curve_client_key=client_secret)
            client = ZmqClient(address, curve_server_key=server_public, curve_client_key=client_secret)
            try:
                with pytest.raises(PermissionError, match="refused this client's CurveZMQ key"):
                    async for _ in stranger.generate("Hello", SamplingParams(max_tokens=2)):
                        pass
                with pytest.raises(PermissionError):  # and every later call
                    await stranger.check_health()
                with pytest.raises(EngineStartError, match="handshake"):
                    async for _ in wrong_server.generate("Hello", SamplingParams(max_tokens=2)):
                        pass
                outs = [o async for o in client.generate("Hello", SamplingParams(temperature=0, max_tokens=2))]
                assert outs[-1].finished and len(outs[-1].outputs[0].token_ids) == 2
                assert (await client.check_health()).num_running == 0
            finally:
                for c in (stranger, wrong_server, client):
                    await c.close()
        asyncio.run(asyncio.wait_for(main(), 60))
    finally:
        stop(proc, log)


def client_public_in(folder) -> str:
    """A public key that is not the server's: the client's own, as a client that mixed up the files has."""
    return str(folder / "client.key")


def raw_clients_get_nothing(address: str, server_public: str, stranger_secret: str) -> None:
    """A plain socket and a stranger's CurveZMQ socket: neither gets through the handshake, nothing is
    answered; once refused, ZMQ drops the stranger's queue, so its send may not even be taken."""
    spk, _ = zmq.auth.load_certificate(server_public)
    pk, sk = zmq.auth.load_certificate(stranger_secret)

    def as_stranger(s):
        s.curve_serverkey, s.curve_publickey, s.curve_secretkey = spk, pk, sk
    ctx = zmq.Context()
    sockets = []
    try:
        sockets = [dealer(ctx, address), dealer(ctx, address, as_stranger)]
        for s in sockets:
            s.setsockopt(zmq.RCVTIMEO, 2000)
            try:
                s.send(pack({"type": "health_ping", "nonce": 1}), zmq.NOBLOCK)
            except zmq.Again:
                continue
            with pytest.raises(zmq.Again):
                s.recv_multipart()
    finally:
        for s in sockets:
            s.close(linger=0)
        ctx.destroy(linger=0)

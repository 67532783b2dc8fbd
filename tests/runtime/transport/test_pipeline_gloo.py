"""Acceptance: two gloo processes, 200 fire-and-forget tensor-dict sends, received one step late."""
import os
import socket
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def test_two_process_gloo_sends_arrive_bit_identical():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "GLOO_SOCKET_IFNAME": "lo"}
    procs = [subprocess.Popen([sys.executable, "-m", "tests.runtime.transport.pp_peer", str(rank), str(port)],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
             for rank in (0, 1)]
    try:
        outs = [p.communicate(timeout=120)[0].decode() for p in procs]  # the timeout guards against deadlock
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert [p.returncode for p in procs] == [0, 0], outs
    assert "received all" in outs[1]
    high_water = int(outs[0].split("high water")[1].split()[0])
    assert 1 <= high_water <= 4

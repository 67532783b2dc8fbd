"""A child's heartbeat tells slow from stuck: it beats while its loop turns (``LOOP``) or while the loop is
held by a step that computes (``BUSY``), and falls silent while the loop is held by a call that computes
nothing."""
import asyncio
import os
import time

import torch

from actorserve.runtime.liveness import BUSY, LOOP, Heartbeat

INTERVAL = 0.1


def _beats(fd: int) -> bytes:
    try:
        return os.read(fd, 4096)
    except BlockingIOError:
        return b""


async def test_beats_while_turning_or_computing_and_not_while_stuck():
    r, w = os.pipe()
    os.set_blocking(r, False)
    heartbeat = Heartbeat(w, INTERVAL)
    heartbeat.start(asyncio.get_running_loop())
    try:
        await asyncio.sleep(0.5)  # the loop turns
        turning = _beats(r)
        a = torch.randn(256, 256)
        start = time.monotonic()
        while time.monotonic() - start < 0.8:  # the loop held by work that computes (the GIL let go)
            a = torch.tanh(a @ a)
        computing = _beats(r)
        time.sleep(0.8)  # the loop held by a call that computes nothing
        stuck = _beats(r)
        await asyncio.sleep(0.5)
        again = _beats(r)
    finally:
        heartbeat.stop()
        os.close(r)
        os.close(w)
    assert turning and set(turning) == {LOOP[0]}
    assert computing.count(BUSY) >= 4 and LOOP not in computing[1:]
    assert len(stuck) <= 1  # (the interval that straddled the end of the computing)
    assert LOOP in again

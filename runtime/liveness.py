"""A child's heartbeat, which tells a slow engine from a stuck one.

Runs in every child process (``runtime.actors.child``), on a thread of its own: a step that keeps the event
loop busy for a minute (one long prefill chunk, a host starved by other work) does not stop it, since
torch's operators and the C kernels (called through ctypes) release the GIL while they compute. Each
interval it writes one byte on the ready pipe: ``LOOP`` where the event loop turned since the last beat,
``BUSY`` where it did not but the process computed (its CPU time rose by at least ``BUSY_SHARE`` of the
interval: a step running), and nothing where it did neither (blocked or deadlocked). A stopped process
(SIGSTOP) writes nothing at all. The supervisor (``runtime.supervisor``) declares a child dead after
``hang_timeout`` without a byte, and says when a step has run long on ``BUSY`` beats alone.
"""
from __future__ import annotations

import asyncio
import os
import threading
import time

LOOP, BUSY = b".", b"+"
BUSY_SHARE = 0.05  # of one core over an interval: far above this thread's own few microseconds a beat


class Heartbeat:
    def __init__(self, fd: int, interval: float) -> None:
        self.fd, self.interval = fd, interval
        self._turns = 0  # counted by the loop's own timer
        self._stop = threading.Event()
        self._timer: asyncio.TimerHandle | None = None
        self._thread = threading.Thread(target=self._run, name="heartbeat", daemon=True)

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._tick(loop)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._timer is not None:
            self._timer.cancel()

    def _tick(self, loop: asyncio.AbstractEventLoop) -> None:
        self._turns += 1
        self._timer = loop.call_later(self.interval / 2, self._tick, loop)

    def _run(self) -> None:
        os.set_blocking(self.fd, False)
        turns, cpu = self._turns, time.process_time()
        while not self._stop.wait(self.interval):
            now_turns, now_cpu = self._turns, time.process_time()
            beat = LOOP if now_turns != turns else BUSY if now_cpu - cpu >= BUSY_SHARE * self.interval else None
            turns, cpu = now_turns, now_cpu
            if beat is None:
                continue
            try:
                os.write(self.fd, beat)
            except BlockingIOError:
                pass  # the launcher has beats enough unread
            except OSError:
                return  # the launcher is gone; the death pipe stops us

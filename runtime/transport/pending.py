"""The retained-send FIFO: a send's buffers live until the send has really completed.

Runs in any process that sends without blocking (workers' pipeline sends, ZMQ copy=False sends). Each
entry holds the handles of one logical send and the objects its buffers belong to. Entries are reaped
lazily on later sends, oldest first, stopping at the first still in flight. A device handle (NCCL) gates
completion; a host-only handle (gloo) is never trusted alone, since gloo's ``is_completed()`` can report
done before its copy finished: such entries are waited, not just dropped. When the FIFO is full the
oldest is waited. ``drain()`` at shutdown waits everything.
"""
from __future__ import annotations

from collections import deque
from typing import Any, Iterable, Protocol, Sequence


class SendHandle(Protocol):
    def is_completed(self) -> bool: ...

    def wait(self) -> Any: ...


class OnceHandle:
    """Makes ``wait()`` idempotent: the underlying handle is waited at most once."""

    __slots__ = ("_handle", "_done")

    def __init__(self, handle: SendHandle) -> None:
        self._handle = handle
        self._done = False

    def is_completed(self) -> bool:
        return self._done or bool(self._handle.is_completed())

    def wait(self) -> None:
        if not self._done:
            self._handle.wait()
            self._done = True


class PendingSend:
    """One logical send: device handles, host handles and the buffers they read."""

    __slots__ = ("device", "host", "buffers")

    def __init__(self, device: Sequence[SendHandle], host: Sequence[SendHandle], buffers: tuple) -> None:
        self.device = [h if isinstance(h, OnceHandle) else OnceHandle(h) for h in device]
        self.host = [h if isinstance(h, OnceHandle) else OnceHandle(h) for h in host]
        self.buffers = buffers

    def in_flight(self) -> bool:
        """Device handles decide; with none, the host handles' own word is only a hint (see wait)."""
        gate = self.device or self.host
        return not all(h.is_completed() for h in gate)

    def wait(self) -> None:
        for h in self.device:
            h.wait()
        for h in self.host:  # the backstop: a host copy may lag the device and its own is_completed()
            h.wait()
        self.buffers = ()

    def holds(self, obj: object) -> bool:
        return any(b is obj for b in self.buffers)


class PendingSends:
    def __init__(self, max_entries: int = 64) -> None:
        if max_entries < 1:
            raise ValueError(f"max_entries must be >= 1, got {max_entries}")
        self.max_entries = max_entries
        self._fifo: deque[PendingSend] = deque()
        self.high_water = 0

    def __len__(self) -> int:
        return len(self._fifo)

    def add(self, buffers: Iterable[object], device: Sequence[SendHandle] = (),
            host: Sequence[SendHandle] = ()) -> PendingSend:
        """Retain one send; reaps finished ones first and waits the oldest if the FIFO is full."""
        self.reap()
        while len(self._fifo) >= self.max_entries:
            self._fifo.popleft().wait()
        entry = PendingSend(device, host, tuple(buffers))
        self._fifo.append(entry)
        self.high_water = max(self.high_water, len(self._fifo))
        return entry

    def reap(self) -> int:
        """Release completed sends, oldest first, stopping at the first still in flight."""
        released = 0
        while self._fifo and not self._fifo[0].in_flight():
            self._fifo.popleft().wait()
            released += 1
        return released

    def wait_for(self, obj: object) -> None:
        """Before a buffer is written again: wait every send up to the last one that still reads it."""
        last = max((i for i, e in enumerate(self._fifo) if e.holds(obj)), default=-1)
        for _ in range(last + 1):
            self._fifo.popleft().wait()

    def drain(self) -> None:
        while self._fifo:
            self._fifo.popleft().wait()

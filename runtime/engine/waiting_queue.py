"""The scheduler's queue of requests waiting for a place in the batch: first come, first served, and a request
taken out of it anywhere (an abort) in constant time.

A deque's ``remove`` scans the queue, so a client that queued hundreds of thousands of sequences and went
away took minutes to abort, one scan a sequence. Here a request leaves by being finished: its entry stays
until it reaches the head, or until the dead entries outnumber the live ones and the queue is rebuilt
without them, which keeps both the time and the memory of a removal constant on average.
"""
from __future__ import annotations

from collections import deque
from typing import Iterable, Iterator

from actorserve.runtime.engine.request import Request

_COMPACT_ABOVE = 1024  # dead entries tolerated before the queue is rebuilt, if they outnumber the live ones


class WaitingQueue:
    def __init__(self) -> None:
        self._queue: deque[Request] = deque()
        self._live = 0
        self._dead = 0

    def __len__(self) -> int:
        return self._live

    def __bool__(self) -> bool:
        return self._live > 0

    def __iter__(self) -> Iterator[Request]:
        return (r for r in self._queue if not r.status.finished)

    def append(self, request: Request) -> None:
        self._queue.append(request)
        self._live += 1

    def appendleft(self, request: Request) -> None:
        self._queue.appendleft(request)
        self._live += 1

    def extendleft(self, requests: Iterable[Request]) -> None:
        for request in requests:
            self.appendleft(request)

    def head(self) -> Request:
        self._drop_finished_head()
        return self._queue[0]

    def popleft(self) -> Request:
        self._drop_finished_head()
        self._live -= 1
        return self._queue.popleft()

    def discard(self, request: Request) -> None:
        """``request``, finished already, is no longer waiting."""
        self._live -= 1
        self._dead += 1
        if self._dead > max(_COMPACT_ABOVE, self._live):
            self._queue = deque(r for r in self._queue if not r.status.finished)
            self._dead = 0

    def _drop_finished_head(self) -> None:
        while self._queue and self._queue[0].status.finished:
            self._queue.popleft()
            self._dead -= 1

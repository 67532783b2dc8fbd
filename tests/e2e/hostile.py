"""What every hostile-input test checks after each bad message: the engine answers a normal request
within a second, and no process has grown more than 20% above its idle resident memory."""
from __future__ import annotations

import time
from typing import Callable

GROWTH = 1.2
ANSWER_S = 1.0


class Bounded:
    def __init__(self, rss: Callable[[], dict[str, int]], normal: Callable[[], object]) -> None:
        self._rss, self._normal = rss, normal
        for _ in range(3):  # warm: the first requests allocate what every later one reuses
            normal()
        self.idle = rss()

    def check(self, what: str) -> None:
        start = time.monotonic()
        self._normal()
        took = time.monotonic() - start
        assert took < ANSWER_S, f"after {what}: a normal request took {took:.2f} s"
        now = self._rss()
        grown = {name: (now[name], size) for name, size in self.idle.items() if now.get(name, 0) > GROWTH * size}
        assert not grown, f"after {what}: resident memory grew past 120% of idle: {grown}"

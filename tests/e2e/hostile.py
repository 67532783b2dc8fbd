"""What every hostile-input test checks after each bad message: the engine answers a normal request
within a second, and no process has grown more than 20% above its idle resident memory. Idle is measured
with the KV cache filled once: its pages become resident as blocks are first used, up to the budget, and
that is no growth to watch for."""
from __future__ import annotations

import re
import time
from typing import Callable

GROWTH = 1.2
ANSWER_S = 1.0
FILL_PROMPT_TOKENS = 900


class Bounded:
    def __init__(self, rss: Callable[[], dict[str, int]], normal: Callable[[], object],
                 fill: Callable[[str], object], fill_tokens: int) -> None:
        """``fill(prompt)`` runs one prompt; prompts of about 900 tokens each, with distinct first words (no
        prefix shared), pass ``fill_tokens`` (at least the KV cache's capacity) through the cache."""
        self._rss, self._normal = rss, normal
        for i in range(-(-fill_tokens // FILL_PROMPT_TOKENS)):
            fill(f"{i} " + "hello " * FILL_PROMPT_TOKENS)
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


def kv_tokens(log: bytes) -> int:
    """The KV cache's capacity in tokens, from the worker's start-up line in the server's log."""
    return int(re.search(rb"KV cache: \d+ blocks of \d+ tokens \((\d+) tokens", log).group(1))

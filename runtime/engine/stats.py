"""The periodic stats line a vLLM user reads in the server's log, from the engine's running totals."""
from __future__ import annotations

import bisect
import time
from dataclasses import dataclass
from typing import Optional

STATS_INTERVAL_S = 10.0
# vLLM's buckets of vllm:iteration_tokens_total (tokens in one engine step)
ITERATION_TOKEN_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)


class StepTokens:
    """How many tokens each engine step ran, bucketed as Prometheus counts them (le: cumulative)."""

    def __init__(self) -> None:
        self.counts = [0] * (len(ITERATION_TOKEN_BUCKETS) + 1)  # the last one: above every bucket
        self.total = 0

    def observe(self, tokens: int) -> None:
        self.counts[bisect.bisect_left(ITERATION_TOKEN_BUCKETS, tokens)] += 1
        self.total += tokens


@dataclass
class _Snapshot:
    at: float
    prompt_tokens: int
    generation_tokens: int
    queries: int
    hits: int


class StatsLine:
    """Throughput since the last line, and the scheduler's state now. A line is due every interval while
    the engine is busy, and once more when it falls idle (so the log ends on zeros, as vLLM's does)."""

    def __init__(self, interval: float = STATS_INTERVAL_S) -> None:
        self.interval = interval
        self._last: Optional[_Snapshot] = None
        self._was_busy = False

    def take(self, core, now: Optional[float] = None) -> Optional[str]:
        now = time.monotonic() if now is None else now
        s, pool = core.scheduler, core.kv.pool
        snap = _Snapshot(now, s.num_prompt_tokens, s.num_generation_tokens, pool.queries, pool.hits)
        last, self._last = self._last, snap
        if last is None:
            return None
        busy = bool(s.running or s.waiting) or snap.prompt_tokens != last.prompt_tokens or \
            snap.generation_tokens != last.generation_tokens
        if not busy and not self._was_busy:
            return None
        self._was_busy = busy
        elapsed = max(now - last.at, 1e-9)
        queries = snap.queries - last.queries
        hit_rate = 100.0 * (snap.hits - last.hits) / queries if queries else 0.0
        return (f"Avg prompt throughput: {(snap.prompt_tokens - last.prompt_tokens) / elapsed:.1f} tokens/s, "
                f"Avg generation throughput: {(snap.generation_tokens - last.generation_tokens) / elapsed:.1f} "
                f"tokens/s, Running: {len(s.running)} reqs, Waiting: {len(s.waiting)} reqs, "
                f"KV cache usage: {100.0 * pool.usage:.1f}%, Prefix cache hit rate: {hit_rate:.1f}%")

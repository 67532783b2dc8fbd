"""CUDA graphs for decode steps: each step of n decodes replays the graph captured for the smallest
captured batch size >= n, its inputs padded to that size; a step with prefills, or more decodes than the
largest size, runs eagerly.

The capture sizes are 1, 2, 4 and then every multiple of 8, up to a ceiling: min(max_num_seqs,
max_num_batched_tokens, max_cudagraph_capture_size). No size above the ceiling is ever captured or
padded to (a step can never hold more decodes than the scheduler allows, and a graph past that is memory
spent for nothing, the regression of vLLM #54418). The attention plan of a captured step is written into
static buffers on the host side before the replay, never inside a capture: a metadata builder that
synchronised inside it would record a stale value. ``--enforce-eager`` turns capture off.
"""
from __future__ import annotations

import bisect
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence


def capture_sizes(max_num_seqs: int, max_num_batched_tokens: int, max_capture_size: int,
                  sizes: Optional[Sequence[int]] = None) -> list[int]:
    """The batch sizes to capture: ``sizes`` (default 1, 2, 4, 8, 16, 24, ...), those above the ceiling
    dropped."""
    ceiling = min(max_num_seqs, max_num_batched_tokens, max_capture_size)
    if sizes is None:
        sizes = [1, 2, 4, *range(8, ceiling + 1, 8)]
    return sorted({int(s) for s in sizes if 1 <= s <= ceiling})


def padded_size(n: int, sizes: Sequence[int]) -> Optional[int]:
    """The captured size a step of n decodes replays (None: it runs eagerly)."""
    at = bisect.bisect_left(sizes, n)
    return sizes[at] if n >= 1 and at < len(sizes) else None


@dataclass
class GraphStats:
    replays: Counter = field(default_factory=Counter)  # by captured size
    eager: int = 0
    padded_rows: int = 0  # rows replayed that were padding


class DecodeGraphs:
    """The captured graphs of one model runner, by batch size.

    ``capture(n)`` records a decode step of n rows over the runner's static buffers and returns something
    with ``replay()`` (a ``torch.cuda.CUDAGraph``; tests give a fake); ``load(rows, size)`` writes a
    step's real rows, padded to the captured size, into those buffers; ``output(size, n)`` reads the first
    n rows of that size's captured output."""

    def __init__(self, sizes: Sequence[int], capture: Callable[[int], Any], load: Callable[[Any, int], None],
                 output: Callable[[int, int], Any]) -> None:
        self.sizes = list(sizes)
        self._capture, self._load, self._output = capture, load, output
        self.graphs: dict[int, Any] = {}
        self.stats = GraphStats()

    def capture_all(self) -> None:
        """Largest first, as vLLM does: the smaller graphs then reuse the first one's memory pool."""
        for n in reversed(self.sizes):
            self.graphs[n] = self._capture(n)

    def replays(self, n: int, decode_only: bool) -> Optional[int]:
        """The size a step of n rows replays, or None (eager)."""
        size = padded_size(n, self.sizes) if decode_only else None
        return size if size in self.graphs else None

    def run(self, rows: Any, n: int, decode_only: bool, eager: Callable[[], Any]) -> Any:
        size = self.replays(n, decode_only)
        if size is None:
            self.stats.eager += 1
            return eager()
        self._load(rows, size)
        self.graphs[size].replay()
        self.stats.replays[size] += 1
        self.stats.padded_rows += size - n
        return self._output(size, n)

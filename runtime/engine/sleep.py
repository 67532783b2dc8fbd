"""Sleep mode's levels and tags, checked at the edge (the scheduler, the Python API, the HTTP endpoints).

Runs wherever a sleep or wake-up call arrives; the workers do the releasing (runtime.model.memory.sleep_mode).
"""
from __future__ import annotations

from typing import Optional, Sequence

LEVELS = (1, 2)  # 1: the weights kept in a backing copy; 2: the weights discarded (reloaded on wake-up)
WAKE_TAGS = ("weights", "kv_cache")


def check_level(level: int) -> int:
    if isinstance(level, bool) or level not in LEVELS:
        raise ValueError(f"sleep level must be 1 (weights kept in a backing copy) or 2 (weights discarded), "
                         f"got {level!r}")
    return level


def check_tags(tags: Optional[Sequence[str]]) -> tuple[str, ...]:
    """The tags to wake, in order, each once; None is both."""
    if tags is None:
        return WAKE_TAGS
    if isinstance(tags, str) or not all(isinstance(t, str) and t in WAKE_TAGS for t in tags):
        raise ValueError(f"tags must be a list of {', '.join(WAKE_TAGS)} (or None for both), got {tags!r}")
    return tuple(dict.fromkeys(tags))

"""Summaries shared by the benchmark tools: mean, median and p99 in milliseconds."""
from __future__ import annotations

import statistics
from typing import Sequence


def summary_ms(values: Sequence[float]) -> dict:
    if not values:
        return {"mean": None, "median": None, "p99": None}
    ordered = sorted(values)
    p99 = ordered[min(len(ordered) - 1, int(round(0.99 * (len(ordered) - 1))))]
    return {"mean": statistics.fmean(ordered) * 1e3, "median": statistics.median(ordered) * 1e3, "p99": p99 * 1e3}

"""Our C kernels named in torch profiles, as operators (``actorserve::...``), so that a profile's operator
time includes them and the host-side share of a step (``bench latency``) does not count them as Python."""
from __future__ import annotations

from typing import Any, Callable

import torch


def call(name: str, fn: Callable[..., Any], *args: Any) -> Any:
    if torch.autograd._profiler_enabled():
        with torch.profiler.record_function(name):
            return fn(*args)
    return fn(*args)

"""The process's heap: glibc keeps what was freed in its arenas for reuse instead of handing it back to the
OS, so a process that once held scratch memory (a model's load, a tokenizer's conversion, a giant prompt,
a dropped buffer) would stay that much bigger for good. ``trim_heap`` hands it back."""
from __future__ import annotations

import ctypes


def trim_heap() -> None:
    """glibc's ``malloc_trim(0)`` over every arena; nothing where the C library is not glibc."""
    trim = getattr(ctypes.CDLL(None), "malloc_trim", None)
    if trim is not None:
        trim(0)

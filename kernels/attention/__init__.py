"""Paged attention backends behind one interface.

A backend writes the new tokens' K/V into the paged cache and attends each query over its sequence's
cached keys. The torch reference is the ground truth that faster backends (the CPU C kernels, triton,
flashinfer) are tested against; ``selector`` picks one per model and device.

The names below are imported on first use, so that ``selector`` (which the config reads, in processes
that never load torch) can be imported alone.
"""
from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "AttentionBackend": "interface", "AttentionMetadata": "interface", "SequenceGroup": "interface",
    "TorchPagedMetadata": "torch_ref", "TorchRefBackend": "torch_ref", "paged_attention": "torch_ref",
    "write_kv_ref": "torch_ref",
}
__all__ = [*_EXPORTS, "cpu_decode"]


def __getattr__(name: str) -> Any:
    if name == "cpu_decode":
        return importlib.import_module(f"{__name__}.cpu_decode")
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)

"""Triton kernels for the GPU workers: the row operations (RMSNorm with and without the residual add,
SiLU-and-multiply), rotary + KV-cache write, unified paged attention (prefill chunks and decodes in one
launch, sliding windows and soft caps), top-k/top-p sampling, fused mixture-of-experts, and the GDN
layers' decode step.

triton is an optional dependency (the ``cuda`` and ``test`` extras): nothing imports these modules until
a triton path is chosen, and each one imports triton itself. Every kernel has its torch reference (the
CPU path's own, where one exists) and a test against it; on a machine without a GPU the tests run the
kernels on CPU tensors under ``TRITON_INTERPRET=1``, which must be set before a module is imported
(triton decides at ``@triton.jit`` whether a kernel is interpreted).
"""
from __future__ import annotations

import importlib
from typing import Any, Optional

_modules: dict[str, Any] = {}  # by name: the module, or None where triton is not installed


def for_tensor(x: Any, module: str) -> Optional[Any]:
    """``kernels.triton.<module>`` for a tensor on a GPU, where triton is installed; else None (the
    caller's own path serves). The module is imported on the first such call."""
    if not x.is_cuda:
        return None
    if module not in _modules:
        try:
            _modules[module] = importlib.import_module(f"{__name__}.{module}")
        except ImportError:
            _modules[module] = None
    return _modules[module]

"""The route to an operation's triton form, for the GPU workers. Each operation's package holds its torch
reference, its C form for the CPU where it has one, and its triton form (``*_triton``): the row operations
(RMSNorm with and without the residual add, SiLU-and-multiply) and rotary + KV-cache write in
``elementwise``, unified paged attention (prefill chunks and decodes in one launch, sliding windows and
soft caps) in ``attention``, top-k/top-p sampling in ``sampling``, fused mixture-of-experts in ``moe``,
and the GDN layers' decode step in ``linear_attention``.

triton is an optional dependency (the ``cuda`` and ``test`` extras): nothing imports a triton form until
its path is chosen, and each one imports triton itself. Every kernel has its torch reference (the
CPU path's own, where one exists) and a test against it; on a machine without a GPU the tests run the
kernels on CPU tensors under ``TRITON_INTERPRET=1``, which must be set before a module is imported
(triton decides at ``@triton.jit`` whether a kernel is interpreted).
"""
from __future__ import annotations

import importlib
from typing import Any, Optional

_modules: dict[str, Any] = {}  # by name: the module, or None where triton is not installed


def for_tensor(x: Any, module: str) -> Optional[Any]:
    """The triton form ``module`` (its full name) for a tensor on a GPU, where triton is installed; else
    None (the caller's own path serves). The module is imported on the first such call."""
    if not x.is_cuda:
        return None
    if module not in _modules:
        try:
            _modules[module] = importlib.import_module(module)
        except ImportError:
            _modules[module] = None
    return _modules[module]

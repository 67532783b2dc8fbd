"""Matrix products: ``linear`` sends each product to the fastest kernel whose gate admits it, else torch.

A bf16 CPU weight is normally prepacked at load (oneDNN's blocked layout, ``prepacked``), which serves
every batch size; the skinny kernel serves plain bf16 weights of few-row products where packing is not
available. Measured side by side at 1 to 4 rows, holding both layouts bought at most about 7% (within
the machine's noise) for twice the weight memory, so a matrix is held in one layout only.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch.nn import functional as F

from kernels.gemm import prepacked, skinny
from kernels.gemm.prepacked import PackedWeight


def linear(x: torch.Tensor, weight: Optional[torch.Tensor], bias: Optional[torch.Tensor] = None,
           packed: Optional[PackedWeight] = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)``; ``weight`` may be None where ``packed`` holds the only copy."""
    if weight is not None and skinny.applies(x, weight, bias):
        return skinny.skinny_linear(x, weight, bias)
    if packed is not None:
        return prepacked.packed_linear(x, packed, bias)
    if weight is None:
        raise ValueError("linear: neither a plain nor a packed weight")
    return F.linear(x, weight, bias)


__all__ = ["PackedWeight", "linear"]

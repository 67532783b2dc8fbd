"""Matrix products: ``linear`` sends each product to the fastest kernel whose gate admits it, else torch.

A bf16 CPU weight is normally prepacked at load (oneDNN's blocked layout, ``prepacked``), which serves
every batch size; the skinny kernel serves plain bf16 weights of few-row products where packing is not
available. Measured side by side at 1 to 4 rows, holding both layouts bought at most about 7% (within
the machine's noise) for twice the weight memory, so a matrix is held in one layout only. Where oneDNN
has no bf16 GEMM for the CPU (AVX2 and older), the other bf16 products are widened to fp32 (``widened``). A weight
quantized at load (``int8``, opt-in) takes the int8 product, and a GGUF weight kept as the file's blocks
(``gguf``: fp32 models) the product that decodes them, or with ``gguf_q8`` the integer product with
int8-quantized activations.
"""
from __future__ import annotations

from typing import Optional, Union

import torch
from torch.nn import functional as F

from actorserve.kernels.gemm import skinny, widened
from actorserve.kernels.gemm.gguf import GgufWeight
from actorserve.kernels.gemm.gguf_q8 import GgufQ8Weight
from actorserve.kernels.gemm.int8 import Int8Weight
from actorserve.kernels.gemm.prepacked import PackedWeight
from actorserve.kernels.gemm.rows_product import RowsProduct

# A weight prepared once at load in place of the plain matrix; each kind computes F.linear from its form.
PreparedWeight = Union[PackedWeight, Int8Weight, GgufWeight, GgufQ8Weight]


def linear(x: torch.Tensor, weight: Optional[torch.Tensor], bias: Optional[torch.Tensor] = None,
           packed: Optional[PreparedWeight] = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)``; ``weight`` may be None where ``packed`` holds the only copy."""
    if weight is not None and skinny.applies(x, weight, bias):
        return skinny.skinny_linear(x, weight, bias)
    if packed is not None:
        return packed.apply(x, bias)
    if weight is None:
        raise ValueError("linear: neither a plain nor a packed weight")
    if widened.applies(x, weight, bias):
        return widened.widened_linear(x, weight, bias)
    return F.linear(x, weight, bias)


__all__ = ["GgufQ8Weight", "GgufWeight", "Int8Weight", "PackedWeight", "PreparedWeight", "RowsProduct", "linear"]

"""bf16 weights reordered once, at load, into oneDNN's blocked layout for the CPU.

``F.linear`` on a plain [N, K] bf16 weight makes oneDNN reorder (and so re-read and re-write) the weight
inside every call. Reordering it once, as inductor's CPU weight freezing does, makes every product of a
decode or prefill step cheaper: on this project's 2-core machine the model's 120 linears at 32 rows take
about 26 ms instead of 38, at 1 row 11 ms instead of 19 (``bench/gemm_paths.py`` measures them side by side).
The results are oneDNN's own bf16 GEMM's, so a prepacked model gives the tokens of an unpacked one.

The packed tensor replaces the plain weight (it is an opaque oneDNN tensor: nothing but
``packed_linear`` reads it), so packing costs no memory except for a tied lm_head, which keeps the plain
embedding table for lookups beside its packed copy. fp32 stays on torch's plain path, the setting held
exact against the reference.
"""
from __future__ import annotations

from typing import Optional

import torch

from actorserve.kernels import capability
from actorserve.kernels.gemm.rows_product import ROWS, RowsProduct

# oneDNN picks the blocked layout for an expected row count. Measured on the model's shapes, a hint of 1,
# 32 or 256 serves 1 to 256 rows alike; no hint made 1-row products 40% slower.
BATCH_HINT = 32


def available() -> bool:
    """This process's gate (``capability.CpuPaths.prepacked_bf16``): oneDNN takes bf16 weights on this CPU."""
    return capability.current().prepacked_bf16


def applies(weight: torch.Tensor) -> bool:
    """Whether ``pack`` takes this weight; the gate of this path alone."""
    return (weight.dtype == torch.bfloat16 and weight.device.type == "cpu" and weight.dim() == 2
            and not weight.requires_grad and available())


class PackedWeight:
    """A weight [out_features, in_features] in oneDNN's blocked layout."""

    def __init__(self, weight: torch.Tensor) -> None:
        if not applies(weight):
            raise ValueError("PackedWeight: a bf16 CPU matrix without grad, on a torch built with oneDNN")
        self.out_features, self.in_features = weight.shape
        self.tensor = torch.ops.mkldnn._reorder_linear_weight(weight.contiguous(), BATCH_HINT)

    def apply(self, x: torch.Tensor, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
        return packed_linear(x, self, bias)

    def rows_product(self, bias: Optional[torch.Tensor], dtype: torch.dtype) -> Optional[RowsProduct]:
        """``packed_linear`` less its checks and reshapes, straight to oneDNN: the decode step's rows are its
        own contiguous bf16 (None for another dtype)."""
        if dtype != torch.bfloat16:
            return None
        op, tensor = torch.ops.mkldnn._linear_pointwise.default, self.tensor
        return RowsProduct(ROWS, lambda rows: op(rows, tensor, bias, "none", [], ""), self.out_features)


def packed_linear(x: torch.Tensor, packed: PackedWeight, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` for bf16 x, from the packed weight."""
    if x.dtype != torch.bfloat16 or x.shape[-1] != packed.in_features:
        raise ValueError(f"packed_linear: bf16 input of {packed.in_features} features, got {x.dtype} "
                         f"{tuple(x.shape)}")
    rows = x.reshape(-1, packed.in_features)
    if not rows.is_contiguous():
        rows = rows.contiguous()
    out = torch.ops.mkldnn._linear_pointwise(rows, packed.tensor, bias, "none", [], "")  # profiled as mkldnn::
    return out.view(*x.shape[:-1], packed.out_features)

"""How a weight multiplies the rows of a decode step, bound once at load: each weight kind says it for
itself (``rows_product``), and the decode fast path (``runtime.model.execution.decode_fast_path``) chains them. A new
weight kind that gives one joins that path without touching it; one that gives none (or none for the
model's dtype) is multiplied there through its module (``Linear.forward``)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch

ROWS = "rows"  # run(rows [T, K]) -> rows [T, N], both of the model's dtype
INT8 = "int8"  # run(q [T, K] int8, acc [T, N] int32) writes the integer product into acc


@dataclass(frozen=True)
class RowsProduct:
    """``takes`` is the form of the rows ``run`` multiplies. An int8 product leaves its integers for the
    pass after it to scale, with the rows' scales, ``scale`` (one per output channel) and ``bias``, so that
    pass can fuse the scaling with what comes next."""

    takes: str
    run: Callable[..., Optional[torch.Tensor]]
    out_features: int
    scale: Optional[torch.Tensor] = None
    bias: Optional[torch.Tensor] = None
    # ROWS only, where the kind can: into(x_p, out_p, t, threads) writes the product of t contiguous rows at
    # address x_p into t contiguous rows at out_p (both of the model's dtype), for t up to into_rows (more go
    # through run): a decode step's products then allocate nothing and pass pointers the step already holds
    into: Optional[Callable[[int, int, int, int], None]] = None
    into_rows: int = 0

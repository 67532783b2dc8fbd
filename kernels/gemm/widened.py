"""bf16 products on a CPU without a bf16 GEMM: the weight widened to fp32 a slab at a time, then torch's
fp32 GEMM.

Where oneDNN has no bf16 GEMM for the CPU (AVX2 and older: ``capability.CpuPaths.bf16_gemm``), torch
multiplies bf16 matrices in a scalar loop, several times slower than its fp32 GEMM on the same CPU
(``bench/gemm_paths.py`` measures both). Widening bf16 to fp32 is exact, so this is the fp32 product of the
same values, rounded to bf16 once, as oneDNN's bf16 GEMM (fp32 accumulation) would round it. The weight is
widened per call, a slab of output rows at a time, so that the fp32 copy stays small: holding one for
the whole model would double the memory that bf16 is chosen to save. Few-row products stay on the skinny
kernel, which reads the bf16 weight as it is (the gate in ``kernels.gemm.linear`` asks it first), and
below ``MIN_ROWS`` on torch.
"""
from __future__ import annotations

from typing import Optional

import torch

from actorserve.kernels import capability

SLAB_ELEMENTS = 1 << 20  # weight values widened at a time: 4 MiB of fp32
# Below this many rows, widening the whole weight costs more than torch's scalar loop saves (where the
# skinny kernel is not built: a CPU below AVX2)
MIN_ROWS = 4


def available() -> bool:
    """This process's gate: bf16 products take this path where oneDNN has no bf16 GEMM for the CPU."""
    return not capability.current().bf16_gemm


def applies(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None) -> bool:
    return (x.dtype == torch.bfloat16 and weight.dtype == torch.bfloat16 and x.device.type == "cpu"
            and weight.device.type == "cpu" and weight.dim() == 2 and x.dim() >= 1
            and x.shape[-1] == weight.shape[1] and x.numel() >= MIN_ROWS * x.shape[-1]
            and (bias is None or bias.dtype == torch.bfloat16)
            and not (torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad))
            and available())


def widened_linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` for bf16 x and weight, computed in fp32; callers check ``applies``."""
    n, k = weight.shape
    rows = x.reshape(-1, k).float()
    out = torch.empty(rows.shape[0], n, dtype=torch.float32)
    if rows.shape[0]:
        slab = max(1, SLAB_ELEMENTS // max(1, k))
        for n0 in range(0, n, slab):
            w = weight[n0:n0 + slab].float()
            if bias is None:
                torch.mm(rows, w.t(), out=out[:, n0:n0 + slab])
            else:
                torch.addmm(bias[n0:n0 + slab].float(), rows, w.t(), out=out[:, n0:n0 + slab])
    return out.to(torch.bfloat16).view(*x.shape[:-1], n)

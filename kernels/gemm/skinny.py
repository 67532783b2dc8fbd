"""Few-row bf16 products (``x @ w.T`` with x of at most ``MAX_ROWS`` rows) on CPUs with AVX2 or AVX-512 BF16.

A decode step multiplies a handful of rows by every weight matrix, so it is bound by reading the weights.
oneDNN's bf16 path reads them well below the memory's bandwidth; ``skinny_bf16.c`` streams them faster
(``bench/gemm_paths.py`` measures the paths side by side). Past about 8
rows the product is bound by arithmetic and oneDNN's blocked GEMM is as fast or faster, so the gate sends
only skinny products here (the larger ones go to oneDNN, or where it has no bf16 GEMM to ``widened``). Where the weights are prepacked at load (``prepacked``, the default where torch
has oneDNN), that path is as fast at every size, so this kernel serves plain weights only. fp32 is left to
torch: the fp32 default is the setting held exact against the reference, and a different summation order
would break that.
"""
from __future__ import annotations

import ctypes
from pathlib import Path
from typing import Optional

import torch

from actorserve.kernels.native import CpuKernelLibrary
from actorserve.kernels.profiling import call

MAX_ROWS = 8
SOURCE = Path(__file__).with_name("skinny_bf16.c")
PROFILE_NAME = "actorserve::skinny_linear_bf16"


_library = CpuKernelLibrary(SOURCE, {
    "skinny_linear_bf16": (None, [ctypes.c_void_p] * 4 + [ctypes.c_int64] * 3 + [ctypes.c_int]),
})


def available() -> bool:
    return _library.get() is not None


def applies(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None) -> bool:
    """Whether ``skinny_linear`` takes this product; the gate of this kernel alone."""
    return (x.dtype == torch.bfloat16 and weight.dtype == torch.bfloat16 and x.device.type == "cpu"
            and weight.device.type == "cpu" and weight.dim() == 2 and x.dim() >= 1
            and x.numel() // max(1, x.shape[-1]) <= MAX_ROWS and x.shape[-1] == weight.shape[1]
            and weight.is_contiguous() and (bias is None or (bias.dtype == torch.bfloat16 and bias.is_contiguous()))
            and not (torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad))
            and available())


def skinny_linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` for bf16 x of at most MAX_ROWS rows; callers check ``applies`` first."""
    lib = _library.get()
    if lib is None:
        raise RuntimeError("the skinny bf16 GEMM kernel is not available on this machine")
    k, n = weight.shape[1], weight.shape[0]
    rows = x.reshape(-1, k).contiguous()
    out = torch.empty(rows.shape[0], n, dtype=torch.bfloat16)
    if rows.shape[0]:
        args = (rows.data_ptr(), weight.data_ptr(), None if bias is None else bias.data_ptr(), out.data_ptr(),
                rows.shape[0], n, k, torch.get_num_threads())
        call(PROFILE_NAME, lib.skinny_linear_bf16, *args)
    return out.view(*x.shape[:-1], n)

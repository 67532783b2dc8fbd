"""Few-row bf16 products (``x @ w.T`` with x of at most ``MAX_ROWS`` rows) on CPUs with AVX-512 BF16.

A decode step multiplies a handful of rows by every weight matrix, so it is bound by reading the weights.
oneDNN's bf16 path reads them at about 12 GB/s on this project's 2-core machines; ``skinny_bf16.c``
streams them at about twice that (``bench/gemm_paths.py`` measures the paths side by side). Past about 8 rows
the product is bound by arithmetic and oneDNN's blocked GEMM is as fast or faster, so the gate sends only
skinny products here. Where the weights are prepacked at load (``prepacked``, the default where torch has
oneDNN) that path serves every size and only a tied lm_head's plain table still comes here. fp32 is left to torch: the fp32 default is the setting held exact against the
reference, and a different summation order would break that.
"""
from __future__ import annotations

import ctypes
import os
import platform
from pathlib import Path
from typing import Optional

import torch
from torch.nn import functional as F

from kernels.native import load

MAX_ROWS = 8
SOURCE = Path(__file__).with_name("skinny_bf16.c")
PROFILE_NAME = "actorserve::skinny_linear_bf16"
FLAGS = ["-O3", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512bf16", "-fopenmp"]


def cpu_has_avx512_bf16() -> bool:
    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64"):
        return False
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return "avx512_bf16" in line.split()
    except OSError:
        pass
    return False


class _Library:
    """The built kernel, loaded at most once per process (None where the CPU or the build says no)."""

    def __init__(self) -> None:
        self._lib: Optional[ctypes.CDLL] = None
        self._tried = False

    def get(self) -> Optional[ctypes.CDLL]:
        if not self._tried:
            self._tried = True
            if os.environ.get("ACTORSERVE_CPU_KERNELS", "1") != "0" and cpu_has_avx512_bf16():
                lib = load(SOURCE, FLAGS)
                if lib is not None:
                    fn = lib.skinny_linear_bf16
                    fn.restype = None
                    fn.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int64] * 3 + [ctypes.c_int]
                self._lib = lib
        return self._lib


_library = _Library()


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
        if torch.autograd._profiler_enabled():  # named in profiles, as an operator (not host time)
            with torch.profiler.record_function(PROFILE_NAME):
                lib.skinny_linear_bf16(*args)
        else:
            lib.skinny_linear_bf16(*args)
    return out.view(*x.shape[:-1], n)


def skinny_linear_ref(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    return F.linear(x, weight, bias)

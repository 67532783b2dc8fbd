"""ctypes front of ``fused_rows.c``: RMSNorm, residual add + RMSNorm, SiLU-and-multiply and the rotary
embedding on bf16 or fp32 rows, one C call each where torch takes four to six operators. At decode batch
sizes those dispatches, not the arithmetic, are the cost (60 norms, 30 activations and 30 rotations a step
for a 30-layer model)."""
from __future__ import annotations

import ctypes
from pathlib import Path
from typing import Optional

import torch

from actorserve.kernels.native import CpuKernelLibrary
from actorserve.kernels.profiling import call

SOURCE = Path(__file__).with_name("fused_rows.c")
_SIGNATURES = {
    "rms_norm": (None, [ctypes.c_void_p] * 5 + [ctypes.c_int64] * 2 + [ctypes.c_float, ctypes.c_int]),
    "rotary": (None, [ctypes.c_void_p, ctypes.c_int64] + [ctypes.c_void_p] * 3 + [ctypes.c_int64] * 3
               + [ctypes.c_int]),
    "silu_mul": (None, [ctypes.c_void_p] * 2 + [ctypes.c_int64] * 2 + [ctypes.c_int]),
    "argmax": (None, [ctypes.c_void_p] * 2 + [ctypes.c_int64] * 2 + [ctypes.c_int]),
}
DTYPES = (torch.bfloat16, torch.float32)  # the element types the source is built for
_libraries = {dtype: CpuKernelLibrary(SOURCE, _SIGNATURES, str(dtype).removeprefix("torch.")) for dtype in DTYPES}


def available(dtype: torch.dtype = torch.bfloat16) -> bool:
    return library(dtype) is not None


def library(dtype: torch.dtype = torch.bfloat16) -> Optional[ctypes.CDLL]:
    """The library built for rows of ``dtype``, with its signatures declared (functions by their plain
    names: ``rms_norm``, ``rotary``, ...), for callers that plan a whole step on raw pointers
    (``runtime.model.execution.decode_fast_path``); None where it is not available."""
    lib = _libraries.get(dtype)
    return None if lib is None else lib.get()


def applies(x: torch.Tensor, *others: torch.Tensor) -> bool:
    """CPU tensors of one dtype the source is built for, x of at least one dimension, no autograd; the
    gate of this path alone."""
    tensors = (x, *others)
    return (x.dtype in DTYPES and all(t.dtype == x.dtype and t.device.type == "cpu" for t in tensors)
            and x.dim() >= 1 and not (torch.is_grad_enabled() and any(t.requires_grad for t in tensors))
            and available(x.dtype))


def _rows(x: torch.Tensor) -> torch.Tensor:
    return x.reshape(-1, x.shape[-1]).contiguous()


def profile_name(op: str, dtype: torch.dtype) -> str:
    """The name the profiler records an operation on rows of ``dtype`` under."""
    return f"actorserve::{op}_{'bf16' if dtype == torch.bfloat16 else 'f32'}"


def _name(op: str, x: torch.Tensor) -> str:
    return profile_name(op, x.dtype)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    n = x.shape[-1]
    if weight.shape != (n,):
        raise ValueError(f"rms_norm: weight of shape ({n},), got {tuple(weight.shape)}")
    rows, w = _rows(x), weight.contiguous()
    out = torch.empty_like(rows)
    call(_name("rms_norm", x), library(x.dtype).rms_norm, rows.data_ptr(), None, None, w.data_ptr(),
         out.data_ptr(), rows.shape[0], n, eps, torch.get_num_threads())
    return out.view(x.shape)


def add_rms_norm(x: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor,
                 eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    n = x.shape[-1]
    if weight.shape != (n,) or delta.shape != x.shape:
        raise ValueError(f"add_rms_norm: x and delta of one shape, weight ({n},); got {tuple(x.shape)}, "
                         f"{tuple(delta.shape)}, {tuple(weight.shape)}")
    rows, d, w = _rows(x), _rows(delta), weight.contiguous()
    h, out = torch.empty_like(rows), torch.empty_like(rows)
    call(_name("add_rms_norm", x), library(x.dtype).rms_norm, rows.data_ptr(), d.data_ptr(), h.data_ptr(),
         w.data_ptr(), out.data_ptr(), rows.shape[0], n, eps, torch.get_num_threads())
    return h.view(x.shape), out.view(x.shape)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    if gate_up.shape[-1] % 2:
        raise ValueError(f"silu_mul: an even last dimension (gate then up), got {gate_up.shape[-1]}")
    rows = _rows(gate_up)
    n = rows.shape[1] // 2
    out = torch.empty(rows.shape[0], n, dtype=gate_up.dtype)
    call(_name("silu_mul", gate_up), library(gate_up.dtype).silu_mul, rows.data_ptr(), out.data_ptr(),
         rows.shape[0], n, torch.get_num_threads())
    return out.view(*gate_up.shape[:-1], n)


def rotary_applies(x: torch.Tensor, cos: torch.Tensor, sin_signed: torch.Tensor) -> bool:
    """x [T, heads, D] with contiguous heads (rows may be strided, as q and k inside a fused qkv output);
    the tables [T, 1, D] contiguous, of x's dtype; D even."""
    return (applies(x, cos, sin_signed) and x.dim() == 3 and x.stride(2) == 1 and x.stride(1) == x.shape[2]
            and x.shape[2] % 2 == 0 and cos.shape == sin_signed.shape == (x.shape[0], 1, x.shape[2])
            and cos.is_contiguous() and sin_signed.is_contiguous())


def rotary(x: torch.Tensor, cos: torch.Tensor, sin_signed: torch.Tensor) -> torch.Tensor:
    t, heads, d = x.shape
    out = torch.empty(t, heads, d, dtype=x.dtype)
    call(_name("rotary", x), library(x.dtype).rotary, x.data_ptr(), x.stride(0), cos.data_ptr(),
         sin_signed.data_ptr(), out.data_ptr(), t, heads, d, torch.get_num_threads())
    return out


def argmax(x: torch.Tensor) -> torch.Tensor:
    """``x.argmax(dim=-1)`` of a 2-D bf16 or fp32 x with a non-empty last dimension."""
    rows = x.contiguous()
    out = torch.empty(rows.shape[0], dtype=torch.int64)
    call(_name("argmax", x), library(x.dtype).argmax, rows.data_ptr(), out.data_ptr(), rows.shape[0],
         rows.shape[1], torch.get_num_threads())
    return out

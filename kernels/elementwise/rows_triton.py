"""RMSNorm (optionally after the residual add) and SiLU-and-multiply, one program a row, in fp32.

References: ``kernels.elementwise.rms_norm_ref`` / ``silu_mul_ref`` (transformers' numerics: the norm in
fp32, cast back to the model dtype, then scaled by the weight in the model dtype)."""
from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl


@triton.jit
def _rms_norm_kernel(x_ptr, delta_ptr, weight_ptr, out_ptr, sum_ptr, n_cols, x_stride, delta_stride,
                     out_stride, sum_stride, eps, HAS_DELTA: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    dtype = out_ptr.dtype.element_ty
    # every operation in fp32, rounded to the model dtype where torch's sequence rounds
    xf = tl.load(x_ptr + row * x_stride + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_DELTA:
        xf = xf + tl.load(delta_ptr + row * delta_stride + cols, mask=mask, other=0.0).to(tl.float32)
        xf = xf.to(dtype).to(tl.float32)
        tl.store(sum_ptr + row * sum_stride + cols, xf.to(dtype), mask=mask)
    variance = tl.sum(xf * xf, axis=0) / n_cols
    normed = (xf * tl.rsqrt(variance + eps)).to(dtype).to(tl.float32)
    w = tl.load(weight_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * out_stride + cols, (normed * w).to(dtype), mask=mask)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float,
             delta: Optional[torch.Tensor] = None) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """rms_norm(x) [.., H]; with ``delta``, (x + delta, rms_norm(x + delta)) as ``add_rms_norm``."""
    shape = x.shape
    rows = x.reshape(-1, shape[-1])
    out = torch.empty_like(rows)
    summed = torch.empty_like(rows) if delta is not None else out
    d = delta.reshape(-1, shape[-1]) if delta is not None else rows
    if rows.stride(-1) != 1 or d.stride(-1) != 1:
        rows, d = rows.contiguous(), d.contiguous()
    n = rows.shape[1]
    _rms_norm_kernel[(rows.shape[0],)](rows, d, weight, out, summed, n, rows.stride(0), d.stride(0), out.stride(0),
                                       summed.stride(0), eps, HAS_DELTA=delta is not None,
                                       BLOCK=triton.next_power_of_2(n))
    if delta is None:
        return out.view(shape)
    return summed.view(shape), out.view(shape)


@triton.jit
def _silu_mul_kernel(x_ptr, out_ptr, n_cols, x_stride, out_stride, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n_cols
    dtype = out_ptr.dtype.element_ty
    g = tl.load(x_ptr + row * x_stride + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * x_stride + n_cols + cols, mask=mask, other=0.0).to(tl.float32)
    # silu in fp32, rounded to the model dtype, then the product rounded again (torch's order)
    act = (g / (1.0 + tl.exp(-g))).to(dtype).to(tl.float32)
    tl.store(out_ptr + row * out_stride + cols, (act * up).to(dtype), mask=mask)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up of gate_up [.., 2I] -> [.., I]."""
    shape = gate_up.shape
    rows = gate_up.reshape(-1, shape[-1]).contiguous()
    n = shape[-1] // 2
    out = torch.empty((rows.shape[0], n), dtype=gate_up.dtype, device=gate_up.device)
    block = min(1024, triton.next_power_of_2(n))
    _silu_mul_kernel[(rows.shape[0], triton.cdiv(n, block))](rows, out, n, rows.stride(0), out.stride(0), BLOCK=block)
    return out.view(*shape[:-1], n)

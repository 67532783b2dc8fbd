"""W4A16 GEMM over the GGUF file's 4-bit blocks as stored (Q4_0, Q4_1): y = x @ W^T, each weight decoded in
registers to exactly the value the reference decoder gives (``runtime.model.gguf_dequant``), the sums in
fp32. The weight is the file's bytes, [N, K / 32 * block bytes] uint8, as ``kernels.gemm.gguf`` holds it
on the CPU: Q4_0 is an fp16 scale d and 16 bytes (value j the low nibble of byte j, value 16 + j its high
nibble; w = d (q - 8)), Q4_1 adds an fp16 minimum m after d (w = d q + m)."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

# block bytes and where the nibbles start, per type
LAYOUTS = {"Q4_0": (18, 2), "Q4_1": (20, 4)}


@triton.jit
def _fp16_at(ptr, mask):
    lo = tl.load(ptr, mask=mask, other=0).to(tl.uint16)
    hi = tl.load(ptr + 1, mask=mask, other=0).to(tl.uint16)
    return (lo | (hi << 8)).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def _w4a16_kernel(x_ptr, w_ptr, out_ptr, M, N, K, x_stride, w_stride, out_stride,
                  BLOCK_BYTES: tl.constexpr, QS_AT: tl.constexpr, HAS_MIN: tl.constexpr,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    j = tl.arange(0, 16)
    row_mask = rows < M
    col_mask = cols < N
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for kb in range(0, K // 32):
        block = w_ptr + cols.to(tl.int64) * w_stride + kb * BLOCK_BYTES
        d = _fp16_at(block, col_mask)
        qs = tl.load(block[:, None] + QS_AT + j[None, :], mask=col_mask[:, None], other=0)
        lo = (qs & 0x0F).to(tl.float32)
        hi = (qs >> 4).to(tl.float32)
        if HAS_MIN:
            m = _fp16_at(block + 2, col_mask)
            w_lo = d[:, None] * lo + m[:, None]
            w_hi = d[:, None] * hi + m[:, None]
        else:
            w_lo = d[:, None] * (lo - 8.0)
            w_hi = d[:, None] * (hi - 8.0)
        x_base = x_ptr + rows[:, None].to(tl.int64) * x_stride + kb * 32 + j[None, :]
        x_lo = tl.load(x_base, mask=row_mask[:, None], other=0.0).to(tl.float32)
        x_hi = tl.load(x_base + 16, mask=row_mask[:, None], other=0.0).to(tl.float32)
        acc += tl.sum(x_lo[:, None, :] * w_lo[None, :, :], axis=2)
        acc += tl.sum(x_hi[:, None, :] * w_hi[None, :, :], axis=2)
    tl.store(out_ptr + rows[:, None].to(tl.int64) * out_stride + cols[None, :],
             acc.to(out_ptr.dtype.element_ty), mask=row_mask[:, None] & col_mask[None, :])


def w4a16_gemm(x: torch.Tensor, blocks: torch.Tensor, type_name: str) -> torch.Tensor:
    """x [M, K] (fp16, bf16 or fp32) times the weight of ``blocks`` [N, K / 32 * block bytes] -> [M, N]."""
    block_bytes, qs_at = LAYOUTS[type_name]
    m, k = x.shape
    n = blocks.shape[0]
    if k % 32 or blocks.shape[1] != k // 32 * block_bytes or blocks.dtype != torch.uint8:
        raise ValueError(f"a {type_name} weight for K={k} is [N, {k // 32 * block_bytes}] uint8, got "
                         f"{tuple(blocks.shape)} {blocks.dtype}")
    x = x.contiguous()
    blocks = blocks.contiguous()
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    block_m = min(16, triton.next_power_of_2(max(m, 1)))
    block_n = 32 if block_m < 16 else 16  # [M, N, 16] products in registers: 16 x 32 spilled on sm_80
    grid = (triton.cdiv(m, block_m), triton.cdiv(n, block_n))
    _w4a16_kernel[grid](x, blocks, out, m, n, k, x.stride(0), blocks.stride(0), out.stride(0),
                        BLOCK_BYTES=block_bytes, QS_AT=qs_at, HAS_MIN=type_name == "Q4_1",
                        BLOCK_M=block_m, BLOCK_N=block_n)
    return out

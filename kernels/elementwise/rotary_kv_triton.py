"""Rotary embedding of q and k fused with the KV-cache write: one launch a step and layer instead of two
rotations and two scatters. Without a table it is the write alone (``reshape_and_cache``), which is what
an attention backend's ``forward`` does with keys the model already rotated.

References: ``kernels.elementwise.rotary_ref`` (rotate-half, as roll by D/2 with the first half of sin
negated) and ``kernels.attention.write_kv_ref``; caches are [KVH, num_blocks, block_size, D].
"""
from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl


@triton.jit
def _rotary_kv_kernel(q_ptr, k_ptr, v_ptr, cos_ptr, sin_ptr, q_out_ptr, k_out_ptr, k_cache_ptr, v_cache_ptr,
                      slot_ptr, q_stride_t, q_stride_h, k_stride_t, k_stride_h, v_stride_t, v_stride_h,
                      table_stride, head_stride_cache, num_q_heads, head_dim,
                      ROTATE: tl.constexpr, BLOCK_D: tl.constexpr):
    t = tl.program_id(0)
    head = tl.program_id(1)  # q heads first, then the KV heads
    d = tl.arange(0, BLOCK_D)
    mask = d < head_dim
    partner = (d + head_dim // 2) % head_dim
    if ROTATE:
        cos = tl.load(cos_ptr + t * table_stride + d, mask=mask, other=0.0).to(tl.float32)
        sin = tl.load(sin_ptr + t * table_stride + d, mask=mask, other=0.0).to(tl.float32)
    if head < num_q_heads:
        if ROTATE:
            base = q_ptr + t * q_stride_t + head * q_stride_h
            x = tl.load(base + d, mask=mask, other=0.0)
            xp = tl.load(base + partner, mask=mask, other=0.0)
            out = x.to(tl.float32) * cos + xp.to(tl.float32) * sin
            tl.store(q_out_ptr + (t * num_q_heads + head) * head_dim + d, out.to(x.dtype), mask=mask)
    else:
        kv = head - num_q_heads
        base = k_ptr + t * k_stride_t + kv * k_stride_h
        x = tl.load(base + d, mask=mask, other=0.0)
        if ROTATE:
            xp = tl.load(base + partner, mask=mask, other=0.0)
            x = (x.to(tl.float32) * cos + xp.to(tl.float32) * sin).to(x.dtype)
            tl.store(k_out_ptr + (t * (tl.num_programs(1) - num_q_heads) + kv) * head_dim + d, x, mask=mask)
        slot = tl.load(slot_ptr + t).to(tl.int64)
        # a negative slot is a padding row (a replayed graph's): nothing stored
        write = mask & ((tl.zeros((BLOCK_D,), tl.int64) + slot) >= 0)
        dst = kv.to(tl.int64) * head_stride_cache + tl.maximum(slot, 0) * head_dim + d
        tl.store(k_cache_ptr + dst, x.to(k_cache_ptr.dtype.element_ty), mask=write)
        value = tl.load(v_ptr + t * v_stride_t + kv * v_stride_h + d, mask=mask, other=0.0)
        tl.store(v_cache_ptr + dst, value.to(v_cache_ptr.dtype.element_ty), mask=write)


def rotary_and_write_kv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                        table: Optional[tuple[torch.Tensor, torch.Tensor]], k_cache: torch.Tensor,
                        v_cache: torch.Tensor, slot_mapping: torch.Tensor
                        ) -> tuple[Optional[torch.Tensor], torch.Tensor]:
    """q [T, H, D], k and v [T, KVH, D], the step's (cos, signed sin) [T, 1, D] (None: no rotation);
    writes the (rotated) keys and the values at ``slot_mapping`` [T] (a negative slot: not written).
    Returns the rotated q and k (q as
    given where there is no table)."""
    t, kvh, d = k.shape
    h = q.shape[1] if table is not None else 0
    if t == 0:
        return q, k
    for x in (q, k, v):
        assert x.stride(-1) == 1, "the head dimension must be contiguous"
    assert k_cache.is_contiguous() and v_cache.is_contiguous()
    slots = slot_mapping.to(device=k.device, dtype=torch.int64).contiguous()
    q_out = torch.empty((t, h, d), dtype=q.dtype, device=q.device) if table is not None else q
    k_out = torch.empty_like(k, memory_format=torch.contiguous_format) if table is not None else k
    cos = sin = k  # (unread without a table)
    if table is not None:
        cos, sin = (x.reshape(t, d).contiguous() for x in table)
    head_stride_cache = k_cache.stride(0)
    _rotary_kv_kernel[(t, h + kvh)](q, k, v, cos, sin, q_out, k_out, k_cache, v_cache, slots,
                                    q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
                                    d, head_stride_cache, h, d, ROTATE=table is not None,
                                    BLOCK_D=triton.next_power_of_2(d))
    return q_out, k_out

"""The GDN layers' delta rule on the GPU, over the state cache's slots, one launch per layer a step:
``recurrent_step`` for the decoding sequences (one token each) and ``recurrent_varlen`` for the prefill
chunks (each program walks its sequence's tokens with a slice of the value columns of one value head's
state [Dk, Dv] in registers, fp32, from the slot, or zeros where the sequence starts, and writes it back at
the end).

References: ``kernels.linear_attention.gated_delta.recurrent_step`` and ``chunked_varlen`` (same arguments,
same results up to fp32 summation order).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl


# The most state elements a program holds in registers (fp32, [Dk, a slice of Dv]): a whole [128, 128] head
# took ptxas to 255 registers a thread; each value column's update reads only its own column, so a head's
# columns are split over programs (tests/kernels/test_compiled_for_gpus.py holds the budget).
STATE_ELEMENTS = 2048


def state_columns(dk: int, dv: int) -> int:
    """The value columns of a head's state one program advances: a power of two within STATE_ELEMENTS."""
    fits = max(1, STATE_ELEMENTS // triton.next_power_of_2(dk))
    return min(triton.next_power_of_2(dv), 1 << (fits.bit_length() - 1))


@triton.jit
def _recurrent_step_kernel(q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, states_ptr, slots_ptr, out_ptr,
                           num_v_heads, group, dk, dv, scale,
                           BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr):
    b = tl.program_id(0)
    h = tl.program_id(1)
    hk = h // group  # the key head this value head reads
    ks = tl.arange(0, BLOCK_K)
    vs = tl.program_id(2) * BLOCK_V + tl.arange(0, BLOCK_V)  # the value columns are independent
    k_mask, v_mask = ks < dk, vs < dv
    num_k_heads = num_v_heads // group
    q = tl.load(q_ptr + (b * num_k_heads + hk) * dk + ks, mask=k_mask, other=0.0).to(tl.float32)
    k = tl.load(k_ptr + (b * num_k_heads + hk) * dk + ks, mask=k_mask, other=0.0).to(tl.float32)
    v = tl.load(v_ptr + (b * num_v_heads + h) * dv + vs, mask=v_mask, other=0.0).to(tl.float32)
    q = q * tl.rsqrt(tl.sum(q * q, axis=0) + 1e-6) * scale  # L2-normalised, as the FLA library does
    k = k * tl.rsqrt(tl.sum(k * k, axis=0) + 1e-6)
    g = tl.load(g_ptr + b * num_v_heads + h).to(tl.float32)
    beta = tl.load(beta_ptr + b * num_v_heads + h).to(tl.float32)
    slot = tl.load(slots_ptr + b).to(tl.int64)
    base = (slot * num_v_heads + h) * dk * dv
    offsets = base + ks[:, None] * dv + vs[None, :]
    mask = k_mask[:, None] & v_mask[None, :]
    s = tl.load(states_ptr + offsets, mask=mask, other=0.0) * tl.exp(g)
    delta = (v - tl.sum(s * k[:, None], axis=0)) * beta
    s = s + k[:, None] * delta[None, :]
    tl.store(states_ptr + offsets, s, mask=mask)
    tl.store(out_ptr + (b * num_v_heads + h) * dv + vs, tl.sum(s * q[:, None], axis=0), mask=v_mask)


def recurrent_step(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                   states: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """As ``kernels.linear_attention.gated_delta.recurrent_step``: q, k [B, Hk, Dk], v [B, Hv, Dv], g and
    beta [B, Hv] fp32, states [S, Hv, Dk, Dv] fp32 advanced in place at rows ``slots``; returns [B, Hv, Dv]
    fp32."""
    b, hk, dk = q.shape
    hv, dv = v.shape[1:]
    out = torch.empty(b, hv, dv, dtype=torch.float32, device=v.device)
    if b == 0:
        return out
    if states.dtype != torch.float32 or not states.is_contiguous():
        raise ValueError("recurrent_step: the states must be contiguous fp32")
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    slots = slots.to(device=v.device, dtype=torch.int64).contiguous()
    block_v = state_columns(dk, dv)
    grid = (b, hv, triton.cdiv(dv, block_v))
    _recurrent_step_kernel[grid](q, k, v, g.float().contiguous(), beta.float().contiguous(), states, slots, out,
                                 hv, hv // hk, dk, dv, dk ** -0.5, BLOCK_K=triton.next_power_of_2(dk), BLOCK_V=block_v)
    return out


@triton.jit
def _recurrent_varlen_kernel(q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, states_ptr, slots_ptr, fresh_ptr, cu_ptr, out_ptr,
                             num_v_heads, group, dk, dv, scale,
                             BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr):
    seq = tl.program_id(0)
    h = tl.program_id(1)
    hk = h // group
    ks = tl.arange(0, BLOCK_K)
    vs = tl.program_id(2) * BLOCK_V + tl.arange(0, BLOCK_V)  # the value columns are independent
    k_mask, v_mask = ks < dk, vs < dv
    mask = k_mask[:, None] & v_mask[None, :]
    num_k_heads = num_v_heads // group
    start = tl.load(cu_ptr + seq).to(tl.int64)
    end = tl.load(cu_ptr + seq + 1).to(tl.int64)
    slot = tl.load(slots_ptr + seq).to(tl.int64)
    offsets = (slot * num_v_heads + h) * dk * dv + ks[:, None] * dv + vs[None, :]
    s = tl.load(states_ptr + offsets, mask=mask, other=0.0)
    s = tl.where(tl.load(fresh_ptr + seq) != 0, tl.zeros_like(s), s)
    for t in range(start, end):
        q = tl.load(q_ptr + (t * num_k_heads + hk) * dk + ks, mask=k_mask, other=0.0).to(tl.float32)
        k = tl.load(k_ptr + (t * num_k_heads + hk) * dk + ks, mask=k_mask, other=0.0).to(tl.float32)
        v = tl.load(v_ptr + (t * num_v_heads + h) * dv + vs, mask=v_mask, other=0.0).to(tl.float32)
        q = q * tl.rsqrt(tl.sum(q * q, axis=0) + 1e-6) * scale
        k = k * tl.rsqrt(tl.sum(k * k, axis=0) + 1e-6)
        s = s * tl.exp(tl.load(g_ptr + t * num_v_heads + h).to(tl.float32))
        delta = (v - tl.sum(s * k[:, None], axis=0)) * tl.load(beta_ptr + t * num_v_heads + h).to(tl.float32)
        s = s + k[:, None] * delta[None, :]
        tl.store(out_ptr + (t * num_v_heads + h) * dv + vs, tl.sum(s * q[:, None], axis=0), mask=v_mask)
    tl.store(states_ptr + offsets, s, mask=mask)


def recurrent_varlen(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                     cu_seqlens, states: torch.Tensor, slots, fresh) -> torch.Tensor:
    """As ``kernels.linear_attention.gated_delta.chunked_varlen``: sequence i is rows cu_seqlens[i] ..
    cu_seqlens[i + 1] of q, k [T, Hk, Dk], v [T, Hv, Dv], g and beta [T, Hv]; its state is row slots[i] of
    ``states`` (zeros first where fresh[i]), advanced in place. Returns [T, Hv, Dv] fp32."""
    from actorserve.kernels.linear_attention.gated_delta import normalise_cu_seqlens

    t, hk, dk = q.shape
    hv, dv = v.shape[1:]
    offsets = normalise_cu_seqlens(cu_seqlens, t)
    n = len(offsets) - 1
    if not len(slots) == len(fresh) == n:
        raise ValueError(f"{n} sequences, {len(slots)} slots and {len(fresh)} fresh flags")
    out = torch.empty(t, hv, dv, dtype=torch.float32, device=v.device)
    if n == 0 or t == 0:
        return out
    if states.dtype != torch.float32 or not states.is_contiguous():
        raise ValueError("recurrent_varlen: the states must be contiguous fp32")
    device = v.device
    as_dev = lambda xs, dtype: torch.as_tensor(list(xs), dtype=dtype).to(device)  # noqa: E731
    block_v = state_columns(dk, dv)
    grid = (n, hv, triton.cdiv(dv, block_v))
    _recurrent_varlen_kernel[grid](q.contiguous(), k.contiguous(), v.contiguous(), g.float().contiguous(),
                                   beta.float().contiguous(), states, as_dev(slots, torch.int64),
                                   as_dev([int(bool(f)) for f in fresh], torch.int32),
                                   as_dev(offsets, torch.int64), out, hv, hv // hk, dk, dv, dk ** -0.5,
                                   BLOCK_K=triton.next_power_of_2(dk), BLOCK_V=block_v)
    return out


__all__ = ["recurrent_step", "recurrent_varlen"]

"""The GDN layers' decode step on the GPU: one program per (decoding sequence, value head) reads the
head's recurrent state [Dk, Dv] from the sequence's slot, applies one token of the gated delta rule in
fp32 and writes the state back, so that a decode step is one launch per layer (the prefill's chunked
form, ``kernels.linear_attention.gated_delta.chunked``, is torch and runs on any device).

Reference: ``kernels.linear_attention.gated_delta.recurrent_step`` (same arguments, same results).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _recurrent_step_kernel(q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, states_ptr, slots_ptr, out_ptr,
                           num_v_heads, group, dk, dv, scale,
                           BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr):
    b = tl.program_id(0)
    h = tl.program_id(1)
    hk = h // group  # the key head this value head reads
    ks = tl.arange(0, BLOCK_K)
    vs = tl.arange(0, BLOCK_V)
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
    _recurrent_step_kernel[(b, hv)](q, k, v, g.float().contiguous(), beta.float().contiguous(), states, slots, out,
                                    hv, hv // hk, dk, dv, dk ** -0.5, BLOCK_K=triton.next_power_of_2(dk),
                                    BLOCK_V=triton.next_power_of_2(dv))
    return out


__all__ = ["recurrent_step"]

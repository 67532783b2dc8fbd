"""The gated delta rule of Qwen3-Next's linear-attention layers (GDN), on a recurrent state per sequence.

For each token t of a sequence, with the state S [Dk, Dv] of its value head:
    S = exp(g_t) * S;   S = S + k_t (beta_t (v_t - S^T k_t))^T;   o_t = S^T q_t,
q and k L2-normalised and q scaled by Dk ** -0.5. ``recurrent_ref`` is that loop, the reference;
``recurrent_step`` is one token for a batch of decoding sequences at once, and ``chunked`` the prefill
form: a chunk of 64 tokens at a time in a few matrix products (the UT transform of the DeltaNet paper),
the state carried between chunks. Both equal the reference up to fp32 summation order.

Everything that accumulates over tokens is fp32 whatever the model's dtype: the state, the decay g and
the write strength beta (computed by the caller from fp32 projections: in bf16, beta's 8-bit mantissa
biases every write, and the error compounds through the recurrence).

Sequences of a step are given by ``cu_seqlens`` (offsets into the flattened tokens); the wrappers take it
as any integer tensor or list and normalise it once (``normalise_cu_seqlens``) before anything indexes.
"""
from __future__ import annotations

from typing import Optional, Sequence, Union

import torch
import torch.nn.functional as F


def normalise_cu_seqlens(cu_seqlens: Union[torch.Tensor, Sequence[int]], total: int) -> list[int]:
    """Host offsets [0, ..., total], checked: non-decreasing, starting at 0 and ending at ``total``."""
    offsets = [int(x) for x in (cu_seqlens.tolist() if isinstance(cu_seqlens, torch.Tensor) else cu_seqlens)]
    if not offsets or offsets[0] != 0 or offsets[-1] != total or any(b < a for a, b in zip(offsets, offsets[1:])):
        raise ValueError(f"cu_seqlens must rise from 0 to the {total} tokens, got {offsets}")
    return offsets


def _prepare(q: torch.Tensor, k: torch.Tensor, num_v_heads: int) -> tuple[torch.Tensor, torch.Tensor]:
    """q and k in fp32, L2-normalised (as the FLA library does), q scaled, their heads repeated for the
    value heads they serve."""
    q, k = q.float(), k.float()
    q = q * torch.rsqrt((q * q).sum(-1, keepdim=True) + 1e-6)
    k = k * torch.rsqrt((k * k).sum(-1, keepdim=True) + 1e-6)
    q = q * q.shape[-1] ** -0.5
    repeat = num_v_heads // k.shape[-2]
    if repeat > 1:
        q, k = q.repeat_interleave(repeat, dim=-2), k.repeat_interleave(repeat, dim=-2)
    return q, k


def recurrent_ref(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                  state: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """One sequence token by token: q, k [T, Hk, Dk], v [T, Hv, Dv], g and beta [T, Hv] (fp32), state
    [Hv, Dk, Dv] or None (zeros). Returns the output [T, Hv, Dv] fp32 and the final state."""
    q, k = _prepare(q, k, v.shape[-2])
    v = v.float()
    s = torch.zeros(v.shape[1], q.shape[-1], v.shape[-1], device=v.device) if state is None else state.float().clone()
    out = torch.empty(v.shape, dtype=torch.float32, device=v.device)
    for t in range(v.shape[0]):
        s = s * g[t].exp()[:, None, None]
        delta = (v[t] - (s * k[t][:, :, None]).sum(-2)) * beta[t][:, None]
        s = s + k[t][:, :, None] * delta[:, None, :]
        out[t] = (s * q[t][:, :, None]).sum(-2)
    return out, s


def recurrent_step(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                   states: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """One token for each of B decoding sequences: q, k [B, Hk, Dk], v [B, Hv, Dv], g and beta [B, Hv]; their
    states are rows ``slots`` of ``states`` [S, Hv, Dk, Dv] fp32, advanced in place. Returns [B, Hv, Dv]."""
    q, k = _prepare(q, k, v.shape[-2])
    s = states.index_select(0, slots)
    s.mul_(g.exp()[:, :, None, None])
    delta = (v.float() - (s * k[:, :, :, None]).sum(-2)) * beta[:, :, None]
    s.add_(k[:, :, :, None] * delta[:, :, None, :])
    states.index_copy_(0, slots, s)
    return (s * q[:, :, :, None]).sum(-2)


def chunked(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
            state: Optional[torch.Tensor] = None, chunk_size: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    """``recurrent_ref`` of one sequence, a chunk at a time: within a chunk the delta rule's writes are one
    triangular solve (the UT transform), and the state passes from chunk to chunk. Same arguments and
    results."""
    t_len, hv, dv = v.shape
    q, k = _prepare(q, k, hv)
    dk = q.shape[-1]
    q, k, v = (x.float().transpose(0, 1) for x in (q, k, v))  # [Hv, T, D]
    g, beta = g.float().t(), beta.float().t()  # [Hv, T]
    pad = (chunk_size - t_len % chunk_size) % chunk_size
    q, k, v = (F.pad(x, (0, 0, 0, pad)) for x in (q, k, v))
    g, beta = F.pad(g, (0, pad)), F.pad(beta, (0, pad))
    n = (t_len + pad) // chunk_size
    q, k, v = (x.reshape(hv, n, chunk_size, -1) for x in (q, k, v))
    g, beta = g.reshape(hv, n, chunk_size), beta.reshape(hv, n, chunk_size)
    k_beta, v_beta = k * beta[..., None], v * beta[..., None]
    cum = g.cumsum(-1)  # the log of the decay from the chunk's start to each position
    upper = torch.ones(chunk_size, chunk_size, dtype=torch.bool, device=v.device).triu(1)
    pair = (cum[..., :, None] - cum[..., None, :]).masked_fill(upper, float("-inf")).exp()
    ut = (k_beta @ k.transpose(-1, -2)) * pair
    new_values = torch.linalg.solve_triangular(ut, v_beta, upper=False, unitriangular=True)
    k_cumdecay = torch.linalg.solve_triangular(ut, k_beta * cum.exp()[..., None], upper=False, unitriangular=True)
    intra = ((q @ k.transpose(-1, -2)) * pair).masked_fill(upper, 0.0)
    q_decayed = q * cum.exp()[..., None]
    k_to_end = k * (cum[..., -1:] - cum).exp()[..., None]
    chunk_decay = cum[..., -1].exp()[..., None, None]
    s = torch.zeros(hv, dk, dv, device=v.device) if state is None else state.float().clone()
    out = torch.empty(hv, n, chunk_size, dv, device=v.device)
    for i in range(n):
        v_new = new_values[:, i] - k_cumdecay[:, i] @ s
        out[:, i] = q_decayed[:, i] @ s + intra[:, i] @ v_new
        s = s * chunk_decay[:, i] + k_to_end[:, i].transpose(-1, -2) @ v_new
    return out.reshape(hv, -1, dv)[:, :t_len].transpose(0, 1), s


def chunked_varlen(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                   cu_seqlens: Union[torch.Tensor, Sequence[int]], states: torch.Tensor, slots: Sequence[int],
                   fresh: Sequence[bool]) -> torch.Tensor:
    """``chunked`` for each sequence of a step's prefill rows: sequence i is rows cu_seqlens[i] ..
    cu_seqlens[i + 1], its state row ``slots[i]`` of ``states`` (zeros first where ``fresh[i]``), updated in
    place. Returns [T, Hv, Dv] fp32."""
    offsets = normalise_cu_seqlens(cu_seqlens, v.shape[0])
    if not len(slots) == len(fresh) == len(offsets) - 1:
        raise ValueError(f"{len(offsets) - 1} sequences, {len(slots)} slots and {len(fresh)} fresh flags")
    out = torch.empty(v.shape, dtype=torch.float32, device=v.device)
    for i, (a, b) in enumerate(zip(offsets, offsets[1:])):
        initial = None if fresh[i] else states[slots[i]]
        out[a:b], final = chunked(q[a:b], k[a:b], v[a:b], g[a:b], beta[a:b], initial)
        states[slots[i]] = final
    return out

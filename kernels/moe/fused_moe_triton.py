"""Fused mixture-of-experts for the GPU workers, as vLLM's fused_moe: the step's (token, expert) pairs
sorted by expert and padded to whole blocks of BLOCK_M, then one launch of a grouped GEMM for the gate|up
products of every expert with tokens (each program a block of pairs of one expert, its weight rows read
once for the block), SiLU-and-multiply, and one more launch for the down products, scaled by the routing
weights; the k outputs of a token are summed last.

Reference: ``runtime.model.architectures.moe.SparseMoE``'s torch path (one product per expert over its tokens).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from actorserve.kernels.elementwise import silu_mul


@triton.jit
def _grouped_gemm_kernel(a_ptr, b_ptr, c_ptr, weights_ptr, pair_ids_ptr, block_expert_ptr, used_ptr, num_pairs, n, k,
                         a_rows_per_pair, stride_am, stride_be, stride_bn, stride_cm,
                         MUL_WEIGHT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                         BLOCK_K: tl.constexpr):
    """c[pair] = a[pair // a_rows_per_pair] @ b[expert]^T for the BLOCK_M pairs of this program's block
    (all of one expert; padding pairs have ids >= num_pairs and are skipped), times the pair's routing
    weight where MUL_WEIGHT."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    if pid_m * BLOCK_M >= tl.load(used_ptr):  # a block past the routing's padded pairs
        return
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    pairs = tl.load(pair_ids_ptr + rows)
    valid = pairs < num_pairs
    expert = tl.load(block_expert_ptr + pid_m).to(tl.int64)
    a_rows = (pairs // a_rows_per_pair).to(tl.int64)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, k, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        a = tl.load(a_ptr + a_rows[:, None] * stride_am + ks[None, :], mask=valid[:, None] & (ks[None, :] < k),
                    other=0.0)
        b = tl.load(b_ptr + expert * stride_be + cols[None, :] * stride_bn + ks[:, None],
                    mask=(cols[None, :] < n) & (ks[:, None] < k), other=0.0)
        acc += tl.dot(a.to(tl.float32), b.to(tl.float32))
    if MUL_WEIGHT:
        acc = acc * tl.load(weights_ptr + pairs, mask=valid, other=0.0).to(tl.float32)[:, None]
    tl.store(c_ptr + pairs.to(tl.int64)[:, None] * stride_cm + cols[None, :], acc.to(c_ptr.dtype.element_ty),
             mask=valid[:, None] & (cols[None, :] < n))


def align_pairs(experts: torch.Tensor, num_experts: int,
                block_m: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The pairs (token * k + j for the j-th expert of a token) sorted by expert, each expert's run padded
    to whole blocks of ``block_m`` with an id past every pair; each block's expert; and how many of the
    ids are used (a one-element tensor).

    Every size here follows from the shapes alone (the ids' length is the most padding any routing can
    need), never from the routing's values: nothing waits on the device, so a CUDA graph captures it. The
    blocks past the used ones hold padding ids and the last expert; the kernel returns at once there."""
    flat = experts.flatten()
    num_pairs = flat.numel()
    device = flat.device
    capacity = triton.cdiv(num_pairs + min(num_experts, num_pairs) * (block_m - 1), block_m)  # blocks
    counts = torch.zeros(num_experts, dtype=torch.int64, device=device).scatter_add_(
        0, flat, torch.ones(num_pairs, dtype=torch.int64, device=device))
    padded = (counts + block_m - 1) // block_m * block_m
    order = flat.argsort(stable=True)
    ends = torch.cumsum(padded, 0)
    starts = ends - padded  # where each expert's run begins in the padded list
    first = torch.cumsum(counts, 0) - counts  # where it begins in the sorted pairs
    sorted_experts = flat[order]
    place = starts[sorted_experts] + torch.arange(num_pairs, device=device) - first[sorted_experts]
    ids = torch.full((capacity * block_m,), num_pairs, dtype=torch.int64, device=device)
    ids[place] = order
    block_starts = torch.arange(capacity, dtype=torch.int64, device=device) * block_m
    block_expert = torch.searchsorted(ends, block_starts, right=True).clamp_(max=num_experts - 1)
    return ids, block_expert, ends[-1:]


def fused_moe(x: torch.Tensor, w_gate_up: torch.Tensor, w_down: torch.Tensor, experts: torch.Tensor,
              weights: torch.Tensor, block_m: int = 16, block_n: int = 32, block_k: int = 32) -> torch.Tensor:
    """x [T, H]; w_gate_up [E, 2I, H], w_down [E, H, I]; each token's experts and routing weights [T, k].
    Returns sum_j weight_j * down_e(silu(gate_e x) * up_e x) [T, H]."""
    t, hidden = x.shape
    num_experts, two_i, _ = w_gate_up.shape
    top_k = experts.shape[1]
    num_pairs = t * top_k
    x, w_gate_up, w_down = x.contiguous(), w_gate_up.contiguous(), w_down.contiguous()
    ids, block_expert, used = align_pairs(experts, num_experts, block_m)
    blocks = block_expert.numel()
    flat_weights = weights.reshape(-1).contiguous()
    gate_up = torch.empty(num_pairs, two_i, dtype=x.dtype, device=x.device)
    _grouped_gemm_kernel[(blocks, triton.cdiv(two_i, block_n))](
        x, w_gate_up, gate_up, flat_weights, ids, block_expert, used, num_pairs, two_i, hidden, top_k,
        x.stride(0), w_gate_up.stride(0), w_gate_up.stride(1), gate_up.stride(0),
        MUL_WEIGHT=False, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k)
    act = silu_mul(gate_up)
    out = torch.empty(num_pairs, hidden, dtype=x.dtype, device=x.device)
    _grouped_gemm_kernel[(blocks, triton.cdiv(hidden, block_n))](
        act, w_down, out, flat_weights, ids, block_expert, used, num_pairs, hidden, two_i // 2, 1,
        act.stride(0), w_down.stride(0), w_down.stride(1), out.stride(0),
        MUL_WEIGHT=True, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k)
    return out.view(t, top_k, hidden).sum(dim=1)


__all__ = ["align_pairs", "fused_moe"]

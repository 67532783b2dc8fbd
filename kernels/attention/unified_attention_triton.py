"""Unified paged attention: every query token of a step (decode rows and prefill chunks alike) in one
launch, each attending causally over its own sequence's pages, as vLLM's triton backend does.

One program takes one query token and one KV head, with the group of query heads that share it, and
walks the sequence's blocks up to the token's position with an online softmax (fp32 scores and sums).
Keys are written before any token attends (``TritonAttentionBackend.forward``), so a chunk's tokens see
each other through the cache. Reference: ``kernels.attention.TorchRefBackend``.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from actorserve.kernels.attention.interface import AttentionMetadata, SequenceGroup
from actorserve.kernels.elementwise.rotary_kv_triton import rotary_and_write_kv


@triton.jit
def _unified_attention_kernel(q_ptr, k_cache_ptr, v_cache_ptr, out_ptr, tables_ptr, token_seq_ptr, token_pos_ptr,
                              q_stride_t, q_stride_h, out_stride_t, out_stride_h, tables_stride, head_stride_cache,
                              scale, num_groups, head_dim, window, softcap,
                              BLOCK_SIZE: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_D: tl.constexpr,
                              SOFTCAP: tl.constexpr, TILE: tl.constexpr):
    t = tl.program_id(0)
    kv = tl.program_id(1)
    g = tl.arange(0, BLOCK_G)
    d = tl.arange(0, BLOCK_D)
    g_mask = g < num_groups
    d_mask = d < head_dim
    heads = kv * num_groups + g
    q = tl.load(q_ptr + t * q_stride_t + heads[:, None] * q_stride_h + d[None, :],
                mask=g_mask[:, None] & d_mask[None, :], other=0.0).to(tl.float32)
    seq = tl.load(token_seq_ptr + t).to(tl.int64)
    pos = tl.load(token_pos_ptr + t).to(tl.int64)
    m = tl.full((BLOCK_G,), float("-inf"), tl.float32)
    total = tl.zeros((BLOCK_G,), tl.float32)
    acc = tl.zeros((BLOCK_G, BLOCK_D), tl.float32)
    cache_head = kv.to(tl.int64) * head_stride_cache
    num_blocks = pos // BLOCK_SIZE + 1
    first = tl.where(window > 0, tl.maximum(pos - window + 1, 0), 0)  # a sliding window's first key
    for j in range(first // BLOCK_SIZE, num_blocks):  # (blocks before the window's are never read)
        block = tl.load(tables_ptr + seq * tables_stride + j).to(tl.int64)
        for s in range(0, BLOCK_SIZE, TILE):  # a page's keys a tile at a time: [G, TILE, D] stays in registers
            n = s + tl.arange(0, TILE)
            key_pos = j * BLOCK_SIZE + n
            visible = (key_pos <= pos) & (key_pos >= first)
            offsets = cache_head + (block * BLOCK_SIZE + n[:, None]) * head_dim + d[None, :]
            kv_mask = visible[:, None] & d_mask[None, :]
            keys = tl.load(k_cache_ptr + offsets, mask=kv_mask, other=0.0).to(tl.float32)
            values = tl.load(v_cache_ptr + offsets, mask=kv_mask, other=0.0).to(tl.float32)
            scores = tl.sum(q[:, None, :] * keys[None, :, :], axis=2) * scale  # [G, TILE]
            if SOFTCAP:  # softcap * tanh(scores / softcap), tanh by its exponential form
                scores = softcap * (1.0 - 2.0 / (tl.exp(2.0 * scores / softcap) + 1.0))
            scores = tl.where(visible[None, :], scores, float("-inf"))
            m_new = tl.maximum(m, tl.max(scores, axis=1))
            # (a tile wholly masked leaves m at -inf; exp(-inf - -inf) is taken as 1 there, as nothing is summed)
            alpha = tl.where(m_new == float("-inf"), 1.0, tl.exp(m - m_new))
            p = tl.where(visible[None, :], tl.exp(scores - m_new[:, None]), 0.0)
            total = total * alpha + tl.sum(p, axis=1)
            acc = acc * alpha[:, None] + tl.sum(p[:, :, None] * values[None, :, :], axis=1)
            m = m_new
    out = acc / total[:, None]
    tl.store(out_ptr + t * out_stride_t + heads[:, None] * out_stride_h + d[None, :],
             out.to(out_ptr.dtype.element_ty), mask=g_mask[:, None] & d_mask[None, :])


# The most fp32 products of a tile a program holds at once ([query heads of a group, keys, head dim]): past
# it ptxas spills (block size 64, 8 query heads a KV head and D 128 spilled 33 KB a thread). The compile
# check (tests/kernels/test_compiled_for_gpus.py) holds every model shape it takes free of spills.
TILE_ELEMENTS = 2048


def tile_keys(block_size: int, groups: int, head_dim: int) -> int:
    """The keys a program takes at once: a power of two that divides the block, within TILE_ELEMENTS (or
    two keys, where one alone is past it)."""
    per_key = triton.next_power_of_2(groups) * triton.next_power_of_2(head_dim)
    fits = max(2, TILE_ELEMENTS // per_key)  # (a tile of one key spilled on sm_80)
    return min(block_size, 1 << (fits.bit_length() - 1))


def unified_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
                      token_seq: torch.Tensor, token_pos: torch.Tensor, scale: float, window: int = 0,
                      softcap: float = 0.0) -> torch.Tensor:
    """q [T, H, D]; caches [KVH, num_blocks, block_size, D]; token t belongs to sequence ``token_seq[t]``
    (a row of ``block_tables``) at position ``token_pos[t]`` and sees its keys 0 .. token_pos[t] (the last
    ``window`` of them where window > 0), with scores capped by softcap * tanh(s / softcap) where > 0."""
    t, h, d = q.shape
    kvh, _, block_size, _ = k_cache.shape
    out = torch.empty_like(q)
    if t == 0:
        return out
    assert q.stride(-1) == 1 and k_cache.is_contiguous() and v_cache.is_contiguous() and block_tables.is_contiguous()
    groups = h // kvh
    _unified_attention_kernel[(t, kvh)](q, k_cache, v_cache, out, block_tables, token_seq, token_pos,
                                        q.stride(0), q.stride(1), out.stride(0), out.stride(1),
                                        block_tables.stride(0), k_cache.stride(0), scale, groups, d, window,
                                        float(softcap), BLOCK_SIZE=block_size,
                                        BLOCK_G=triton.next_power_of_2(groups), BLOCK_D=triton.next_power_of_2(d),
                                        SOFTCAP=softcap > 0, TILE=tile_keys(block_size, groups, d))
    return out


@dataclass
class TritonPlan:
    slot_mapping: torch.Tensor
    block_tables: torch.Tensor  # [B, max_blocks] int32, the decode group's sequences then the prefill's
    token_seq: torch.Tensor  # [T] int32
    token_pos: torch.Tensor  # [T] int32


class TritonAttentionBackend:
    """The unified kernel behind the attention backend interface: the step's plan (each token's sequence
    and position, one block table) is made once on the host, before any layer runs."""

    capturable = True  # forward launches kernels on the plan's tensors, with no host synchronisation

    def __init__(self, num_kv_heads: int, num_blocks: int, block_size: int) -> None:
        self.num_kv_heads, self.num_blocks, self.block_size = num_kv_heads, num_blocks, block_size

    @staticmethod
    def static_plan(rows: int, max_blocks: int, device) -> TritonPlan:
        """Buffers for a captured decode step of up to ``rows`` rows (CUDA graphs replay over them)."""
        return TritonPlan(torch.full((rows,), -1, dtype=torch.int64, device=device),
                          torch.zeros((rows, max_blocks), dtype=torch.int32, device=device),
                          torch.arange(rows, dtype=torch.int32, device=device),
                          torch.zeros(rows, dtype=torch.int32, device=device))

    @staticmethod
    def load_plan(static: TritonPlan, plan: TritonPlan, size: int) -> TritonPlan:
        """``plan`` (a decode step's, one row a sequence) written into the first rows of ``static``; the
        rows up to ``size`` are padding: no KV written (slot -1), each its own empty sequence."""
        n, width = plan.token_seq.shape[0], plan.block_tables.shape[1]
        static.slot_mapping[:n].copy_(plan.slot_mapping, non_blocking=True)
        static.slot_mapping[n:size].fill_(-1)
        static.block_tables[:n, :width].copy_(plan.block_tables, non_blocking=True)
        static.block_tables[n:size].zero_()
        static.token_seq[:n].copy_(plan.token_seq, non_blocking=True)
        static.token_seq[n:size].copy_(torch.arange(n, size, dtype=torch.int32), non_blocking=True)
        static.token_pos[:n].copy_(plan.token_pos, non_blocking=True)
        static.token_pos[n:size].zero_()
        return TritonAttentionBackend.static_view(static, size)

    @staticmethod
    def static_view(static: TritonPlan, size: int) -> TritonPlan:
        """The first ``size`` rows of the static buffers: the plan a graph of that size captures and replays."""
        return TritonPlan(static.slot_mapping[:size], static.block_tables[:size], static.token_seq[:size],
                          static.token_pos[:size])

    block_dim = 1

    @staticmethod
    def kv_cache_shape(num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int) -> tuple[int, ...]:
        return (num_kv_heads, num_blocks, block_size, head_dim)

    def prepare(self, meta: AttentionMetadata) -> TritonPlan:
        groups = [g for g in (meta.decode, meta.prefill) if g is not None]
        device = meta.slot_mapping.device
        width = max((g.block_tables.shape[1] for g in groups), default=1)
        tables, seqs, positions = [], [], []
        first_seq = 0
        for group in groups:
            tables.append(torch.nn.functional.pad(group.block_tables, (0, width - group.block_tables.shape[1])))
            seqs.extend(first_seq + i for i, n in enumerate(_query_lens(group)) for _ in range(n))
            positions.extend(c + j for c, n in zip(_context_lens(group), _query_lens(group)) for j in range(n))
            first_seq += group.block_tables.shape[0]
        as_int = lambda xs: torch.tensor(xs, dtype=torch.int32, device=device)  # noqa: E731
        table = torch.cat(tables).to(device=device, dtype=torch.int32).contiguous() if tables else \
            torch.zeros((1, 1), dtype=torch.int32, device=device)
        return TritonPlan(meta.slot_mapping, table, as_int(seqs), as_int(positions))

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                v_cache: torch.Tensor, meta: TritonPlan, scale: float, window: int = 0,
                softcap: float = 0.0) -> torch.Tensor:
        rotary_and_write_kv(q, k, v, None, k_cache, v_cache, meta.slot_mapping)
        return unified_attention(q, k_cache, v_cache, meta.block_tables, meta.token_seq, meta.token_pos, scale,
                                 window, softcap)


def _query_lens(group: SequenceGroup) -> tuple[int, ...]:
    if group.query_lens:
        return group.query_lens
    starts = group.query_start_loc.tolist()
    return tuple(b - a for a, b in zip(starts, starts[1:]))


def _context_lens(group: SequenceGroup) -> tuple[int, ...]:
    if group.context_lens:
        return group.context_lens
    return tuple(s - n for s, n in zip(group.seq_lens.tolist(), _query_lens(group)))


__all__ = ["TritonAttentionBackend", "TritonPlan", "unified_attention"]

"""Torch paged attention: gather each sequence's blocks once per layer, attend by batched matmuls.

The cache is laid out [KVH, num_blocks, block_size, D], so that the blocks of one KV head form rows of
``block_size * D`` contiguous values: one ``index_select`` of whole blocks gathers every sequence's keys
as [KVH * B, S, D], the layout ``bmm`` takes without another copy (gathering token rows, or permuting
a [B, S, KVH, D] gather, cost two to three times as much). Everything that depends only on the step (the
block indices, the causal mask as an additive bias, the query padding) is planned once per step in
``prepare`` and shared by every layer.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch
import torch.nn.functional as F

from actorserve.kernels.attention.interface import AttentionMetadata, SequenceGroup


def write_kv_ref(k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                 slot_mapping: torch.Tensor) -> None:
    """Store new K/V rows [T, KVH, D] at their slots; caches are [KVH, num_blocks, block_size, D]."""
    kvh, d = k_cache.shape[0], k_cache.shape[-1]
    k_cache.view(kvh, -1, d).index_copy_(1, slot_mapping, k.transpose(0, 1).to(k_cache.dtype))
    v_cache.view(kvh, -1, d).index_copy_(1, slot_mapping, v.transpose(0, 1).to(v_cache.dtype))


@dataclass
class GroupPlan:
    """One sequence group's per-step state, shared by every layer."""

    group: SequenceGroup
    block_rows: torch.Tensor  # [KVH * B * nbl]: rows of the cache viewed as [KVH * num_blocks, bs * D]
    bias: torch.Tensor  # [B, Q, nbl * block_size] fp32: 0 where a query may see a key (the tail masked)
    q_index: Optional[torch.Tensor]  # [B, Q] rows of q, padded queries clamped (None: one query each)
    q_valid: Optional[torch.Tensor]  # [B * Q] which padded queries are real
    fresh: bool  # nothing cached before this step: attend over the new K/V themselves
    q_pos: torch.Tensor  # [B, Q] each query's position
    q_real: torch.Tensor  # [B, Q] which queries are real (not padding)
    windowed: dict[int, torch.Tensor] = field(default_factory=dict)  # window -> bias, made once a step

    def bias_for(self, window: int) -> torch.Tensor:
        """The bias of a layer with a sliding window (keys more than ``window - 1`` before the query are
        masked too); the causal one where window is 0."""
        if window <= 0:
            return self.bias
        bias = self.windowed.get(window)
        if bias is None:
            k_pos = torch.arange(self.bias.shape[-1], device=self.bias.device)
            # (a padded query row keeps its one key, so that its softmax stays finite)
            old = (k_pos[None, None, :] <= self.q_pos[:, :, None] - window) & self.q_real[:, :, None]
            bias = self.windowed[window] = self.bias.masked_fill(old, float("-inf"))
        return bias


@dataclass
class TorchPagedMetadata:
    slot_mapping: torch.Tensor
    decode: Optional[GroupPlan]
    prefill: Optional[GroupPlan]


class TorchRefBackend:
    def __init__(self, num_kv_heads: int, num_blocks: int, block_size: int) -> None:
        self.num_kv_heads, self.num_blocks, self.block_size = num_kv_heads, num_blocks, block_size

    block_dim = 1

    @staticmethod
    def kv_cache_shape(num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int) -> tuple[int, ...]:
        return (num_kv_heads, num_blocks, block_size, head_dim)

    def prepare(self, meta: AttentionMetadata) -> TorchPagedMetadata:
        return TorchPagedMetadata(meta.slot_mapping, self._plan(meta.decode), self._plan(meta.prefill))

    def _plan(self, group: Optional[SequenceGroup]) -> Optional[GroupPlan]:
        if group is None:
            return None
        bs = self.block_size
        nbl = -(-group.max_seq_len // bs)
        tables = group.block_tables[:, :nbl].to(torch.long)
        device = tables.device
        heads = torch.arange(self.num_kv_heads, device=device)[:, None, None] * self.num_blocks
        block_rows = (heads + tables[None]).flatten()
        q_max = group.max_query_len
        q_lens = torch.tensor(group.query_lens, device=device)
        context = torch.tensor(group.context_lens, device=device)
        row = torch.arange(q_max, device=device)
        q_valid = row[None, :] < q_lens[:, None]  # [B, Q]
        q_pos = context[:, None] + row[None, :]  # absolute position of each query
        k_pos = torch.arange(nbl * bs, device=device)
        allowed = (k_pos[None, None, :] <= q_pos[:, :, None]) & q_valid[:, :, None]
        allowed[:, :, 0] |= ~q_valid  # padded query rows see one key, so softmax stays finite; they are dropped
        bias = torch.zeros(allowed.shape, dtype=torch.float32, device=device).masked_fill_(~allowed, float("-inf"))
        q_index = q_valid_flat = None
        if q_max > 1:
            starts = group.query_start_loc[:-1].to(device=device, dtype=torch.long)
            q_index = (starts[:, None] + row[None, :]).clamp(max=group.token_end - group.token_start - 1)
            q_valid_flat = q_valid.flatten()
        return GroupPlan(group, block_rows, bias, q_index, q_valid_flat, not any(group.context_lens), q_pos, q_valid)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                v_cache: torch.Tensor, meta: TorchPagedMetadata, scale: float, window: int = 0,
                softcap: float = 0.0) -> torch.Tensor:
        """As the interface says; a layer with a sliding window sees its last ``window`` keys, and a soft
        cap bounds its scores by softcap * tanh(s / softcap) (Gemma 2)."""
        write_kv_ref(k_cache, v_cache, k, v, meta.slot_mapping)
        if meta.prefill is None and meta.decode is not None:  # decodes only: their output is the step's
            return _attend(q, k_cache, v_cache, meta.decode, scale, window, softcap)
        out = torch.empty_like(q)
        if meta.decode is not None:
            group = meta.decode.group
            out[group.token_start:group.token_end] = _attend(q, k_cache, v_cache, meta.decode, scale, window, softcap)
        if meta.prefill is not None:
            self._prefill(q, k, v, k_cache, v_cache, meta.prefill, scale, out, window, softcap)
        return out

    @staticmethod
    def _prefill(q, k, v, k_cache, v_cache, plan: GroupPlan, scale: float, out: torch.Tensor, window: int = 0,
                 softcap: float = 0.0) -> None:
        """Fresh prompts (nothing cached) attend over their own new K/V; chunks that continue a cached
        prefix, and layers with a window or a soft cap, gather it from the pages."""
        group = plan.group
        if not plan.fresh or window > 0 or softcap > 0:
            out[group.token_start:group.token_end] = _attend(q, k_cache, v_cache, plan, scale, window, softcap)
            return
        start = group.token_start
        for n in group.query_lens:
            out[start:start + n] = causal_attention_ref(q[start:start + n], k[start:start + n], v[start:start + n],
                                                        scale)
            start += n


def _attend(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, plan: GroupPlan,
            scale: float, window: int = 0, softcap: float = 0.0) -> torch.Tensor:
    """The group's own rows of the step's queries, attended over the pages."""
    group = plan.group
    return paged_attention(q[group.token_start:group.token_end], k_cache, v_cache, plan, scale, window, softcap)


def paged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, plan: GroupPlan,
                    scale: float, window: int = 0, softcap: float = 0.0) -> torch.Tensor:
    """Causal attention of one group's queries q [T, H, D] over their sequences' cached K/V (the last
    ``window`` keys where window > 0; scores capped by ``softcap`` where > 0). Each KV head serves its group
    of query heads in one batched matmul; scores and softmax are fp32."""
    kvh, num_blocks, bs, d = k_cache.shape
    h = q.shape[1]
    g = h // kvh
    b, nq, s = plan.bias.shape
    keys = k_cache.view(kvh * num_blocks, bs * d).index_select(0, plan.block_rows).view(kvh * b, s, d)
    values = v_cache.view(kvh * num_blocks, bs * d).index_select(0, plan.block_rows).view(kvh * b, s, d)
    if plan.q_index is None:  # one query per sequence
        qg = q.view(b, kvh, g, d).transpose(0, 1).reshape(kvh * b, g, d)
    else:
        qg = q[plan.q_index].view(b, nq, kvh, g, d).permute(2, 0, 3, 1, 4).reshape(kvh * b, g * nq, d)
    if keys.dtype != q.dtype:  # a cache narrower than the model (--kv-cache-dtype): widened, exactly
        keys, values = keys.to(q.dtype), values.to(q.dtype)
    scores = torch.bmm(qg, keys.transpose(1, 2)).float().mul_(scale)
    if softcap > 0:
        scores = torch.tanh(scores / softcap).mul_(softcap)
    scores = scores.view(kvh, b, g, nq, s).add_(plan.bias_for(window).view(1, b, 1, nq, s))
    probs = scores.softmax(dim=-1).to(values.dtype).view(kvh * b, g * nq, s)
    out = torch.bmm(probs, values).to(q.dtype)  # [KVH * B, G * Q, D]
    if plan.q_index is None:
        return out.view(kvh, b, g, d).transpose(0, 1).reshape(b, h, d)
    out = out.view(kvh, b, g, nq, d).permute(1, 3, 0, 2, 4).reshape(b * nq, h, d)
    return out[plan.q_valid]


def causal_attention_ref(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """Plain causal attention of one sequence with nothing cached before it: q [L, H, D], k/v [L, KVH, D].
    The new K/V are used as they are, with no gather from the paged cache."""
    out = F.scaled_dot_product_attention(q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None],
                                         is_causal=True, scale=scale, enable_gqa=True)
    return out[0].transpose(0, 1)

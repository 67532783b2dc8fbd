"""Torch reference paged attention: gather each sequence's blocks, mask, and attend, batched per group."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from kernels.attention.interface import AttentionMetadata, SequenceGroup


def write_kv_ref(k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                 slot_mapping: torch.Tensor) -> None:
    """Store new K/V rows at their slots; caches are [num_blocks, block_size, KVH, D]."""
    slots = slot_mapping.to(device=k_cache.device, dtype=torch.long)
    k_cache.view(-1, *k_cache.shape[2:]).index_copy_(0, slots, k.to(k_cache.dtype))
    v_cache.view(-1, *v_cache.shape[2:]).index_copy_(0, slots, v.to(v_cache.dtype))


def paged_attention_ref(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                        block_tables: torch.Tensor, seq_lens: torch.Tensor, query_start_loc: torch.Tensor,
                        max_query_len: int, max_seq_len: int, scale: float) -> torch.Tensor:
    """Causal attention of q [T, H, D] (queries are each sequence's last tokens) over its cached K/V."""
    device = q.device
    block_tables = block_tables.to(device=device, dtype=torch.long)
    seq_lens = seq_lens.to(device=device, dtype=torch.long)
    query_start_loc = query_start_loc.to(device=device, dtype=torch.long)
    batch = seq_lens.shape[0]
    block_size = k_cache.shape[1]
    num_blocks = -(-max_seq_len // block_size)
    tables = block_tables[:, :num_blocks]
    keys = k_cache[tables].flatten(1, 2)[:, :max_seq_len]  # [B, S, KVH, D]
    values = v_cache[tables].flatten(1, 2)[:, :max_seq_len]

    q_lens = query_start_loc[1:] - query_start_loc[:-1]
    row = torch.arange(max_query_len, device=device)
    q_valid = row[None, :] < q_lens[:, None]  # [B, Q]
    q_index = (query_start_loc[:-1, None] + row[None, :]).clamp(max=q.shape[0] - 1)
    padded_q = q[q_index]  # [B, Q, H, D]

    q_pos = seq_lens[:, None] - q_lens[:, None] + row[None, :]  # absolute position of each query
    k_pos = torch.arange(max_seq_len, device=device)
    mask = (k_pos[None, None, :] <= q_pos[:, :, None]) & (k_pos[None, None, :] < seq_lens[:, None, None])
    mask &= q_valid[:, :, None]
    mask[:, :, 0] |= ~q_valid  # padded query rows see one key, so softmax stays finite; they are dropped

    out = _grouped_attention(padded_q, keys.to(q.dtype), values.to(q.dtype), mask, scale)  # [B, Q, H, D]
    return out[q_valid].reshape(-1, *q.shape[1:]) if batch else q.new_empty((0, *q.shape[1:]))


def _grouped_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor,
                       scale: float) -> torch.Tensor:
    """q [B, Q, H, D] over k/v [B, S, KVH, D] with mask [B, Q, S]; each KV head serves its group of query
    heads by one batched matmul (no K/V copy per query head), scores and softmax in fp32."""
    b, nq, h, d = q.shape
    kvh = k.shape[2]
    g = h // kvh
    qg = q.view(b, nq, kvh, g, d).permute(0, 2, 3, 1, 4).reshape(b, kvh, g * nq, d)
    scores = torch.matmul(qg, k.permute(0, 2, 3, 1)).float().mul_(scale)  # [B, KVH, G*Q, S]
    scores = scores.view(b, kvh, g, nq, -1).masked_fill_(~mask[:, None, None], float("-inf"))
    probs = scores.softmax(dim=-1).to(v.dtype).view(b, kvh, g * nq, -1)
    out = torch.matmul(probs, v.permute(0, 2, 1, 3))  # [B, KVH, G*Q, D]
    return out.view(b, kvh, g, nq, d).permute(0, 3, 1, 2, 4).reshape(b, nq, h, d)


def causal_attention_ref(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """Plain causal attention of one sequence with nothing cached before it: q [L, H, D], k/v [L, KVH, D].
    The new K/V are used as they are, with no gather from the paged cache."""
    out = F.scaled_dot_product_attention(q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None],
                                         is_causal=True, scale=scale, enable_gqa=True)
    return out[0].transpose(0, 1)


class TorchRefBackend:
    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                v_cache: torch.Tensor, meta: AttentionMetadata, scale: float) -> torch.Tensor:
        write_kv_ref(k_cache, v_cache, k, v, meta.slot_mapping)
        out = torch.empty_like(q)
        if meta.decode is not None:
            group = meta.decode
            out[group.token_start:group.token_end] = _attend(q, k_cache, v_cache, group, scale)
        if meta.prefill is not None:
            self._prefill(q, k, v, k_cache, v_cache, meta.prefill, scale, out)
        return out

    def _prefill(self, q, k, v, k_cache, v_cache, group: SequenceGroup, scale: float, out: torch.Tensor) -> None:
        """Fresh prompts (nothing cached) attend over their own new K/V; chunks that continue a cached
        prefix gather it from the pages."""
        if not group.context_lens or any(group.context_lens):
            out[group.token_start:group.token_end] = _attend(q, k_cache, v_cache, group, scale)
            return
        start = group.token_start
        for n in group.query_lens:
            out[start:start + n] = causal_attention_ref(q[start:start + n], k[start:start + n], v[start:start + n],
                                                        scale)
            start += n


def _attend(q, k_cache, v_cache, group: SequenceGroup, scale: float) -> torch.Tensor:
    return paged_attention_ref(
        q[group.token_start:group.token_end], k_cache, v_cache, group.block_tables, group.seq_lens,
        group.query_start_loc, group.max_query_len, group.max_seq_len, scale,
    )

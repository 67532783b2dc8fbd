"""The attention backend interface and the per-step metadata every backend reads.

Tokens of one step are flattened: decode sequences first (one query token each), then prefill chunks.
Each group is attended separately so that one long prefill does not pad every decode query to its length.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Protocol

import torch


@dataclass
class SequenceGroup:
    """A run of sequences whose query tokens are contiguous in the flattened batch."""

    token_start: int  # first token of the group in the flattened batch
    token_end: int
    block_tables: torch.Tensor  # [B, max_blocks] int64, padded with 0
    seq_lens: torch.Tensor  # [B] int64: tokens in the cache after this step (context + new)
    query_start_loc: torch.Tensor  # [B + 1] int64, relative to token_start
    max_query_len: int
    max_seq_len: int
    query_lens: tuple[int, ...] = ()  # host copies of the lengths, so a backend can pick a path per sequence
    context_lens: tuple[int, ...] = ()  # tokens already in the cache before this step


@dataclass
class AttentionMetadata:
    slot_mapping: torch.Tensor  # [T] int64: block_id * block_size + offset for every new token
    decode: Optional[SequenceGroup]
    prefill: Optional[SequenceGroup]


class AttentionBackend(Protocol):
    """A backend owns the cache layout and turns the step's metadata into its own plan once per step
    (``prepare``), which every layer's ``forward`` then reads."""

    block_dim: int  # the dimension of ``kv_cache_shape`` that counts blocks (a block's copy selects along it)

    @staticmethod
    def kv_cache_shape(num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int) -> tuple[int, ...]:
        ...

    def prepare(self, meta: AttentionMetadata) -> Any:
        ...

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                v_cache: torch.Tensor, meta: Any, scale: float) -> torch.Tensor:
        """q [T, H, D], k/v [T, KVH, D], caches of ``kv_cache_shape``, meta from ``prepare``; returns
        [T, H, D]."""
        ...

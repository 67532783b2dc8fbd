"""FlashInfer attention for CUDA workers: its paged prefill and decode wrappers, planned once a step (at
the first layer, when the scale is known) and run in every layer.

The caches are FlashInfer's NHD layout, [num_blocks, block_size, KVH, D] per layer for K and for V, and
the new tokens' K/V are written with one ``index_copy_`` a layer. Every argument that reaches FlashInfer
passes ``_index`` / ``_dense`` first: index tensors (indptr, indices, last-page lengths, the queries'
indptr) become contiguous int32 on the cache's device, queries and caches contiguous in the model dtype,
whatever the caller built them as. A kernel library may change the index dtypes it accepts from one
version to the next, so the contract lives at this one boundary, and ``FLASHINFER_VERSION`` (the one
pin: the ``cuda`` extra and the docs name the same) is the version it was written against.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

import torch

from actorserve.kernels.attention.interface import AttentionMetadata, SequenceGroup

FLASHINFER_VERSION = "0.7.2.post1"
WORKSPACE_BYTES = 128 << 20
# The query heads a KV head serves that FlashInfer's CUDA-core decode kernels are built for; past 4 the
# tensor-core decode serves every group size and is faster, as vLLM chooses (Qwen2.5-7B has 7, 14B 5).
CUDA_CORE_GROUPS = (1, 2, 3, 4, 6, 8, 16)
TENSOR_CORES_PAST = 4


def decode_on_tensor_cores(num_heads: int, num_kv_heads: int) -> bool:
    group = num_heads // num_kv_heads
    return group > TENSOR_CORES_PAST or group not in CUDA_CORE_GROUPS


def _index(x: torch.Tensor, device: torch.device) -> torch.Tensor:
    return x.to(device=device, dtype=torch.int32).contiguous()


def _dense(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return x.to(dtype).contiguous()


@dataclass
class PagedIndex:
    """One sequence group as FlashInfer reads it."""

    group: SequenceGroup
    qo_indptr: torch.Tensor  # [B + 1] int32: the group's queries, per sequence
    kv_indptr: torch.Tensor  # [B + 1] int32: into kv_indices
    kv_indices: torch.Tensor  # the pages of each sequence in turn, int32
    last_page_len: torch.Tensor  # [B] int32, 1 ..= block_size


@dataclass
class FlashInferPlan:
    slot_mapping: torch.Tensor
    decode: Optional[PagedIndex]
    prefill: Optional[PagedIndex]
    planned: set = field(default_factory=set)  # the (scale, window, softcap) its wrappers are planned for


class FlashInferBackend:
    def __init__(self, num_kv_heads: int, num_blocks: int, block_size: int, kernels: Any = None) -> None:
        """``kernels``: the flashinfer module (tests pass a fake that checks what it receives)."""
        if kernels is None:
            import flashinfer as kernels
        self.kernels = kernels
        self.num_kv_heads, self.num_blocks, self.block_size = num_kv_heads, num_blocks, block_size
        self._wrappers: dict[tuple[str, torch.device], Any] = {}
        self._workspace: dict[torch.device, torch.Tensor] = {}
        self._tensor_cores = False  # decode on tensor cores (set at the first plan, from the heads)

    block_dim = 0

    @staticmethod
    def kv_cache_shape(num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int) -> tuple[int, ...]:
        return (num_blocks, block_size, num_kv_heads, head_dim)

    def prepare(self, meta: AttentionMetadata) -> FlashInferPlan:
        device = meta.slot_mapping.device
        return FlashInferPlan(meta.slot_mapping.to(device=device, dtype=torch.int64).contiguous(),
                              self._index(meta.decode, device), self._index(meta.prefill, device))

    def _index(self, group: Optional[SequenceGroup], device: torch.device) -> Optional[PagedIndex]:
        if group is None:
            return None
        bs = self.block_size
        seq_lens = group.seq_lens.to("cpu", torch.int64)  # host arithmetic, before anything is launched
        pages = (seq_lens + bs - 1) // bs
        tables = group.block_tables.to("cpu", torch.int64)
        used = torch.arange(tables.shape[1])[None, :] < pages[:, None]
        kv_indptr = torch.cat([torch.zeros(1, dtype=torch.int64), pages.cumsum(0)])
        return PagedIndex(group, _index(group.query_start_loc, device), _index(kv_indptr, device),
                          _index(tables[used], device), _index(seq_lens - (pages - 1) * bs, device))

    def _wrapper(self, kind: str, device: torch.device, variant: tuple = ()) -> Any:
        """One wrapper a kind, device and attention variant (window, soft cap): layers of two variants
        (Gemma's sliding and global ones) each keep their plan through the step."""
        wrapper = self._wrappers.get((kind, device, variant))
        if wrapper is None:
            workspace = self._workspace.get(device)
            if workspace is None:  # (zeroed: FlashInfer's documented requirement)
                workspace = self._workspace[device] = torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device=device)
            if kind == "decode":
                wrapper = self.kernels.BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD",
                                                                          use_tensor_cores=self._tensor_cores)
            else:
                wrapper = self.kernels.BatchPrefillWithPagedKVCacheWrapper(workspace, "NHD")
            self._wrappers[(kind, device, variant)] = wrapper
        return wrapper

    def _plan(self, plan: FlashInferPlan, q: torch.Tensor, k_cache: torch.Tensor, scale: float, window: int,
              softcap: float) -> None:
        heads, kvh, d = q.shape[1], k_cache.shape[2], q.shape[2]
        self._tensor_cores = decode_on_tensor_cores(heads, kvh)
        # flashinfer's window_left counts the keys left of the query's own (-1: no window)
        extra = dict(window_left=window - 1 if window > 0 else -1, logits_soft_cap=softcap or None)
        if plan.decode is not None:
            p = plan.decode
            self._wrapper("decode", q.device, (window, softcap)).plan(
                p.kv_indptr, p.kv_indices, p.last_page_len, heads, kvh, d, self.block_size,
                pos_encoding_mode="NONE", sm_scale=scale, q_data_type=q.dtype, kv_data_type=k_cache.dtype, **extra)
        if plan.prefill is not None:
            p = plan.prefill
            self._wrapper("prefill", q.device, (window, softcap)).plan(
                p.qo_indptr, p.kv_indptr, p.kv_indices, p.last_page_len, heads, kvh, d, self.block_size,
                causal=True, sm_scale=scale, q_data_type=q.dtype, kv_data_type=k_cache.dtype, **extra)
        plan.planned.add((scale, window, softcap))

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                v_cache: torch.Tensor, meta: FlashInferPlan, scale: float, window: int = 0,
                softcap: float = 0.0) -> torch.Tensor:
        kvh, d = k_cache.shape[2], k_cache.shape[3]
        k_cache.view(-1, kvh, d).index_copy_(0, meta.slot_mapping, k.to(k_cache.dtype))
        v_cache.view(-1, kvh, d).index_copy_(0, meta.slot_mapping, v.to(v_cache.dtype))
        if (scale, window, softcap) not in meta.planned:  # the step's first layer of this variant plans
            self._plan(meta, q, k_cache, scale, window, softcap)
        caches = (_dense(k_cache, k_cache.dtype), _dense(v_cache, v_cache.dtype))
        out = torch.empty_like(q)
        for kind, index in (("decode", meta.decode), ("prefill", meta.prefill)):
            if index is not None:
                g = index.group
                rows = _dense(q[g.token_start:g.token_end], q.dtype)
                out[g.token_start:g.token_end] = self._wrapper(kind, q.device, (window, softcap)).run(rows, caches)
        return out

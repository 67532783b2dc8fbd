"""Decode attention read straight from the paged bf16 or fp32 cache, on CPUs with AVX2 or AVX-512 BF16: bf16
or fp32 queries over a cache of their own dtype, or fp32 queries over a bf16 cache (``--kv-cache-dtype``).

The torch backend gathers every decoding sequence's K/V blocks into a contiguous copy in every layer
(``index_select``), then runs two small ``bmm``s: at batch 256 that is a third of a decode step, and at
batch 1 the oneDNN calls cost more than the arithmetic. ``paged_attention.c`` (built once per element
type) reads each key and value row once, in place, for all query heads of its KV head, with fp32 scores
and softmax. ``CpuDecodeBackend`` hands it every row of a step: a decode row per sequence, and each row
of a prefill chunk over its own causal prefix (the kernel takes a sequence index and a length per row).
"""
from __future__ import annotations

import ctypes
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch

from actorserve.kernels.attention.interface import AttentionMetadata, SequenceGroup
from actorserve.kernels.attention.torch_ref import TorchRefBackend, write_kv_ref
from actorserve.kernels.native import CpuKernelLibrary
from actorserve.kernels.profiling import call

SOURCE = Path(__file__).with_name("paged_attention.c")
PROFILE_NAME = "actorserve::paged_decode"
MAX_GROUP, MAX_HEAD_DIM = 16, 256  # as in the C source
# the (query, cache) element types the source is built for
DTYPES = ((torch.bfloat16, torch.bfloat16), (torch.float32, torch.float32), (torch.float32, torch.bfloat16))
_SIGNATURES = {
    "paged_decode": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_int64] + [ctypes.c_void_p] * 3 + [ctypes.c_int64]
                     + [ctypes.c_void_p] * 3 + [ctypes.c_int64] * 6
                     + [ctypes.c_float, ctypes.c_int64, ctypes.c_float, ctypes.c_int]),
    "write_kv": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_int64] * 2 + [ctypes.c_void_p] + [ctypes.c_int64] * 3
                 + [ctypes.c_void_p] * 2 + [ctypes.c_int64]),
}


def _element(dtype: torch.dtype, kv_dtype: torch.dtype) -> str:
    """The build's name in ``native.ELEMENTS``: the dtype's, or "float32/bfloat16" over a narrower cache."""
    name = str(dtype).removeprefix("torch.")
    return name if kv_dtype == dtype else f"{name}/{str(kv_dtype).removeprefix('torch.')}"


_libraries = {pair: CpuKernelLibrary(SOURCE, _SIGNATURES, _element(*pair)) for pair in DTYPES}


def available(dtype: torch.dtype = torch.bfloat16, kv_dtype: Optional[torch.dtype] = None) -> bool:
    return library(dtype, kv_dtype) is not None


def library(dtype: torch.dtype = torch.bfloat16, kv_dtype: Optional[torch.dtype] = None) -> Optional[ctypes.CDLL]:
    """The library built for queries of ``dtype`` over caches of ``kv_dtype`` (default: the same), with its
    signatures declared (``paged_decode``, ``write_kv``), for callers that plan a whole step on raw pointers
    (``runtime.model.execution.decode_fast_path``); None where it is not available."""
    lib = _libraries.get((dtype, dtype if kv_dtype is None else kv_dtype))
    return None if lib is None else lib.get()


def supports(dtype: torch.dtype, num_heads: int, num_kv_heads: int, head_dim: int,
             kv_dtype: Optional[torch.dtype] = None) -> bool:
    """Whether the kernel takes a model of this dtype and shape over a cache of ``kv_dtype`` (default: the
    model's): the selector's declaration of it (any block size), so that the two cannot disagree."""
    from actorserve.kernels.attention.selector import BACKENDS, AttentionNeeds

    needs = AttentionNeeds("cpu", dtype, num_heads, num_kv_heads, head_dim, 1, kv_dtype=kv_dtype)
    return BACKENDS["cpu_c"].refusal(needs) is None


def paged_decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
                 seq_lens: torch.Tensor, scale: float, window: int = 0, softcap: float = 0.0) -> torch.Tensor:
    """Attention of one query per sequence, q [B, H, D], over caches [KVH, num_blocks, block_size, D] of q's
    dtype (bf16 or fp32), or bf16 under fp32 queries, holding each sequence's first ``seq_lens[b]`` tokens
    at the blocks ``block_tables[b]`` (int64); over its last ``window`` tokens only where window > 0, with
    scores capped at ``softcap`` (tanh) where it is > 0."""
    if k_cache.dtype != v_cache.dtype or (q.dtype, k_cache.dtype) not in DTYPES:
        raise ValueError(f"paged_decode: no kernel for {q.dtype} queries over a {k_cache.dtype} / {v_cache.dtype} "
                         "cache")
    lib = library(q.dtype, k_cache.dtype)
    if lib is None:
        raise RuntimeError(f"the paged decode kernel for {q.dtype} over a {k_cache.dtype} cache is not available "
                           "on this machine")
    block_size = k_cache.shape[2]
    b = q.shape[0]
    if not (k_cache.is_contiguous() and v_cache.is_contiguous()
            and block_tables.dtype == torch.int64
            and seq_lens.dtype == torch.int64 and block_tables.shape[0] == b == seq_lens.shape[0]):
        raise ValueError("paged_decode: contiguous caches, and int64 block tables and lengths of one row per query")
    if b and int(seq_lens.max()) > block_tables.shape[1] * block_size:
        raise ValueError("paged_decode: a sequence is longer than its block table")
    return _launch(lib, _heads_contiguous(q), k_cache, v_cache, block_tables.contiguous(), seq_lens.contiguous(),
                   scale, window=window, softcap=softcap)


def _heads_contiguous(q: torch.Tensor) -> torch.Tensor:
    """q itself where its heads are contiguous (rows may be strided), else a contiguous copy."""
    return q if q.stride(2) == 1 and q.stride(1) == q.shape[2] else q.contiguous()


def _launch(lib: ctypes.CDLL, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, tables: torch.Tensor,
            lens: torch.Tensor, scale: float, row_seq: Optional[torch.Tensor] = None,
            out: Optional[torch.Tensor] = None, window: int = 0, softcap: float = 0.0) -> torch.Tensor:
    """The kernel call on inputs already checked (``paged_decode``, or once per step in ``prepare``); q's
    heads contiguous; ``out`` (contiguous [B, H, D]) is written where given."""
    kvh, num_blocks, block_size, d = k_cache.shape
    b, h, _ = q.shape
    if out is None:
        out = torch.empty(b, h, d, dtype=q.dtype)
    args = (q.data_ptr(), q.stride(0), k_cache.data_ptr(), v_cache.data_ptr(), tables.data_ptr(), tables.shape[1],
            None if row_seq is None else row_seq.data_ptr(), lens.data_ptr(), out.data_ptr(), b, h, kvh, num_blocks,
            block_size, d, scale, window, softcap, torch.get_num_threads())
    rc = call(PROFILE_NAME, lib.paged_decode, *args)
    if rc != 0:
        raise RuntimeError(f"paged_decode failed ({rc}): shapes outside the kernel, or out of memory")
    return out


def write_kv(k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
             slot_mapping: torch.Tensor) -> None:
    """``write_kv_ref`` in one C call for rows whose heads are contiguous (rows may be strided, as k and v
    inside a fused qkv output) into caches the kernel is built for under their dtype (the same, or bf16
    under fp32 rows, rounded as torch rounds); anything else goes to the torch reference."""
    lib = library(k.dtype, k_cache.dtype)
    kvh, _, _, d = k_cache.shape
    if (lib is None or not (k.dtype == v.dtype and k_cache.dtype == v_cache.dtype)
            or not (k_cache.is_contiguous() and v_cache.is_contiguous())
            or k.shape != v.shape or k.dim() != 3 or k.shape[1:] != (kvh, d)
            or any(t.stride(2) != 1 or t.stride(1) != d for t in (k, v))
            or slot_mapping.dtype != torch.int64 or not slot_mapping.is_contiguous()
            or slot_mapping.shape != (k.shape[0],)):
        write_kv_ref(k_cache, v_cache, k, v, slot_mapping)
        return
    rc = call("actorserve::write_kv", lib.write_kv, k.data_ptr(), k.stride(0), v.data_ptr(), v.stride(0),
              slot_mapping.data_ptr(), k.shape[0], kvh, d, k_cache.data_ptr(), v_cache.data_ptr(),
              k_cache.shape[1] * k_cache.shape[2])
    if rc != 0:
        raise IndexError("write_kv: a slot is outside the KV cache")


@dataclass
class KernelDecodePlan:
    """One group's rows for the kernel: each query row attends over the first ``seq_lens`` cached tokens
    of its sequence (``row_seq``: the row of ``block_tables`` it reads; None where rows are sequences)."""

    group: SequenceGroup
    block_tables: torch.Tensor  # [B, blocks] int64, contiguous
    seq_lens: torch.Tensor  # [rows] int64, contiguous
    row_seq: Optional[torch.Tensor] = None  # [rows] int64, contiguous


@dataclass
class CpuDecodeMetadata:
    slot_mapping: torch.Tensor
    decode: Optional[KernelDecodePlan]
    prefill: Optional[KernelDecodePlan]


class CpuDecodeBackend(TorchRefBackend):
    """Paged attention by the C kernel for bf16 and fp32 models (``supports`` is the gate the runner checks): a
    decode row per sequence, and a prefill chunk's rows each over its own causal prefix, read from the
    cache after the step's K/V are written. The torch backend gathered and padded every prefill chunk (or
    ran SDPA per prompt), about 12-19% of a 2048-token prefill step of SmolLM2."""

    def prepare(self, meta: AttentionMetadata) -> CpuDecodeMetadata:
        """The step's tables and lengths for the kernel (which ``forward`` checks is there for its dtype;
        the runner picks this backend only where ``supports`` says it is)."""
        decode = prefill = None
        if meta.decode is not None:
            g = meta.decode
            if g.max_query_len != 1:
                raise ValueError("CpuDecodeBackend: one query per decoding sequence")
            decode = KernelDecodePlan(g, self._tables(g), g.seq_lens.to(torch.int64).contiguous())
        if meta.prefill is not None:
            g = meta.prefill
            q_lens = torch.tensor(g.query_lens, dtype=torch.int64)
            row_seq = torch.repeat_interleave(torch.arange(len(g.query_lens)), q_lens)
            starts = g.query_start_loc[:-1].to(torch.int64)
            offset = torch.arange(g.token_end - g.token_start) - starts[row_seq]  # the row's place in its chunk
            lens = torch.tensor(g.context_lens, dtype=torch.int64)[row_seq] + offset + 1
            prefill = KernelDecodePlan(g, self._tables(g), lens.contiguous(), row_seq.contiguous())
        return CpuDecodeMetadata(meta.slot_mapping, decode, prefill)

    def _tables(self, g: SequenceGroup) -> torch.Tensor:
        """The group's block tables cut to the blocks its longest sequence uses, which bound every row."""
        return g.block_tables[:, :-(-g.max_seq_len // self.block_size)].to(torch.int64).contiguous()

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                v_cache: torch.Tensor, meta: CpuDecodeMetadata, scale: float, window: int = 0,
                softcap: float = 0.0) -> torch.Tensor:
        write_kv(k_cache, v_cache, k, v, meta.slot_mapping)
        lib = library(q.dtype, k_cache.dtype)
        if lib is None:
            raise ValueError(f"CpuDecodeBackend: no kernel for {q.dtype} queries over a {k_cache.dtype} cache")
        plans = [p for p in (meta.decode, meta.prefill) if p is not None]
        # the tables and lengths were made for the step in prepare; the caches are the runner's own
        if len(plans) == 1 and plans[0].group.token_start == 0 and plans[0].group.token_end == q.shape[0]:
            p = plans[0]
            return _launch(lib, _heads_contiguous(q), k_cache, v_cache, p.block_tables, p.seq_lens, scale, p.row_seq,
                           window=window, softcap=softcap)
        out = torch.empty(q.shape, dtype=q.dtype)
        for p in plans:
            g = p.group
            _launch(lib, _heads_contiguous(q[g.token_start:g.token_end]), k_cache, v_cache, p.block_tables,
                    p.seq_lens, scale, p.row_seq, out[g.token_start:g.token_end], window, softcap)
        return out

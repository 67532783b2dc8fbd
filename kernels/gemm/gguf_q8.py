"""GGUF weights multiplied by activations quantized to int8 per block of 32: llama.cpp's q8 dot products,
opt-in (``--quantization gguf_q8``) because they are approximate.

The exact default (``gguf.GgufWeight``) multiplies every dequantized weight in fp32, which bounds a batch
of decodes by fp32 arithmetic. Here each product is an integer dot product of the stored quants with
the activations', scaled once a block, for every row count: the decodes of a batch and a prefill alike.
Every block type but Q2_K and Q3_K is repacked at load, 16 rows side by side, its quants as the file
stores them (``gguf_q8_layout.h`` gives the layout: the legacy types in as many bytes as the file's, the
others with their scales widened to fp32), for one instruction a 4-value group of 16 rows on AVX-512 VNNI;
lookups of a tied embedding table decode rows of that layout, so the table is held once. Q2_K and Q3_K
(the smallest presets', kept at their size) are multiplied as the file stores them, a row at a time
(``gguf_q8_blocks.c``). The segments of a fused weight share one quantization of the activations.

Gate: ``capability.CpuPaths.q8_isa`` and a C compiler.
"""
from __future__ import annotations

import ctypes
from pathlib import Path
from typing import Callable, Optional

import torch

from actorserve.kernels.gemm.gguf import TYPES, GgufWeight, Segment, ThreadScratch, gather_rows, input_rows
from actorserve.kernels.gemm.rows_product import ROWS, RowsProduct
from actorserve.kernels.native import CpuKernelLibrary
from actorserve.kernels.profiling import call

SOURCE = Path(__file__).with_name("gguf_q8.c")
BLOCKS_SOURCE = Path(__file__).with_name("gguf_q8_blocks.c")
# repacked, 16 rows side by side; Q2_K and Q3_K as stored
Q8_TYPES = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "IQ4_NL", "MXFP4", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS")
INTO_ROWS = 1 << 16  # a decode step's rows go straight to the kernel, whatever their count

_i64, _p, _int = ctypes.c_int64, ctypes.c_void_p, ctypes.c_int
_LINEAR = (_int, [_int, _p, _i64, _p, _p, _p, _i64, _i64, _i64, _int, _p, _int])
_library = CpuKernelLibrary(SOURCE, {
    "gguf_q8_linear": _LINEAR,
    "gguf_q8_packed_bytes": (_i64, [_int, _i64, _i64]),
    "gguf_q8_pack": (_int, [_int, _p, _i64, _i64, _p]),
    "gguf_q8_rows": (_int, [_int, _p, _p, _i64, _i64, _i64, _p]),
}, gate="q8_isa")
_blocks_library = CpuKernelLibrary(BLOCKS_SOURCE, {"gguf_q8_blocks_linear": _LINEAR}, gate="q8_isa")


def available() -> bool:
    return _library.get() is not None and _blocks_library.get() is not None


def takes(weight: GgufWeight) -> bool:
    """Whether every segment of the weight is of a block type these products take (every type the exact
    product takes)."""
    return all(s.type_name in TYPES for s in weight.segments)


class _Part:
    """One segment of the weight: rows [start, start + rows) of the output, packed (``Q8_TYPES``) or its
    blocks as stored, and the kernel that multiplies it."""

    def __init__(self, type_name: str, blocks: torch.Tensor, start: int, rows: int, k: int) -> None:
        self.type_name, self.type_id, self.start, self.rows = type_name, TYPES[type_name][0], start, rows
        if type_name not in Q8_TYPES:
            self.packed, self.stored = blocks, GgufWeight([Segment(type_name, blocks, 0, rows)], k)
            self.linear = _lib(_blocks_library).gguf_q8_blocks_linear
            return
        lib = _lib(_library)
        self.stored, self.linear = None, lib.gguf_q8_linear
        self.packed = torch.empty(lib.gguf_q8_packed_bytes(self.type_id, rows, k), dtype=torch.uint8)
        if lib.gguf_q8_pack(self.type_id, blocks.data_ptr(), rows, k, self.packed.data_ptr()) != 0:
            raise RuntimeError(f"gguf_q8_pack refused {type_name} [{rows}, {k}]")


class GgufQ8Weight:
    """A weight [out_features, in_features] of GGUF blocks, taken from a ``GgufWeight`` (whose blocks it
    replaces where it repacks them), multiplied by int8-quantized activations."""

    def __init__(self, source: GgufWeight) -> None:
        if not takes(source):
            raise ValueError(f"GgufQ8Weight: block types {[s.type_name for s in source.segments]}, "
                             f"not all of {tuple(TYPES)}")
        self.in_features, self.out_features = source.in_features, source.out_features
        self.parts = [_Part(s.type_name, s.blocks, s.start, s.rows, self.in_features) for s in source.segments]

    @property
    def nbytes(self) -> int:
        return sum(p.packed.numel() for p in self.parts)

    def dequantize(self) -> torch.Tensor:
        """The fp32 matrix, the reference decoder's values."""
        return self.rows(torch.arange(self.out_features))

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """The fp32 rows at ``ids`` (any shape): an embedding lookup that decodes only what it gathers."""
        return gather_rows(ids, self.out_features, self.in_features, [(p.start, p.rows, p) for p in self.parts],
                           self._decode)

    def apply(self, x: torch.Tensor, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
        rows = input_rows(x, self.in_features, "GgufQ8Weight")
        out = torch.empty(rows.shape[0], self.out_features, dtype=torch.float32)
        if rows.shape[0]:
            self._bound_product(None if bias is None else bias.float().contiguous())(
                rows.data_ptr(), out.data_ptr(), rows.shape[0], torch.get_num_threads())
        return out.view(*x.shape[:-1], self.out_features)

    def rows_product(self, bias: Optional[torch.Tensor], dtype: torch.dtype) -> Optional[RowsProduct]:
        """``apply`` for the decode plan of an fp32 model (None for another dtype), by pointer into the
        step's buffers for any row count."""
        if dtype != torch.float32:
            return None
        bias = None if bias is None else bias.float().contiguous()
        into = self._bound_product(bias)

        def run(rows: torch.Tensor) -> torch.Tensor:
            return self.apply(rows, bias)
        return RowsProduct(ROWS, run, self.out_features, into=into, into_rows=INTO_ROWS)

    def _decode(self, part: _Part, local: torch.Tensor, into: torch.Tensor) -> None:
        if part.stored is not None:
            into.copy_(part.stored.rows(local))
            return
        if _lib(_library).gguf_q8_rows(part.type_id, part.packed.data_ptr(), local.data_ptr(), local.numel(),
                                       part.rows, self.in_features, into.data_ptr()) != 0:
            raise RuntimeError(f"gguf_q8_rows refused {part.type_name} [{part.rows}, {self.in_features}]")

    def _bound_product(self, bias: Optional[torch.Tensor]) -> Callable[[int, int, int, int], None]:
        """The kernel calls of a product with this bias, bound once: (x_p, out_p, t, threads) multiplies t
        contiguous fp32 rows at x_p into t contiguous rows at out_p. The first segment's call quantizes
        the rows into this thread's scratch; the others read them there."""
        n, k = self.out_features, self.in_features
        calls = [(p.linear, p.type_id, p.packed.data_ptr(), None if bias is None else bias.data_ptr() + 4 * p.start,
                  4 * p.start, p.rows) for p in self.parts]

        def product(x_p: int, out_p: int, t: int, threads: int) -> None:
            scratch = _scratch.get(2 * t * k + 128).data_ptr()  # over what q8_activations.h's layout asks
            for i, (fn, type_id, packed_p, bias_p, offset, seg_rows) in enumerate(calls):
                if call("actorserve::gguf_q8_linear", fn, type_id, x_p, t, packed_p, bias_p, out_p + offset, n,
                        seg_rows, k, threads, scratch, int(i == 0)) != 0:
                    raise RuntimeError(f"the q8 product refused type {type_id} [{seg_rows}, {k}]")
        return product


_scratch = ThreadScratch(torch.uint8)  # the quantized activations


def _lib(library: CpuKernelLibrary) -> ctypes.CDLL:
    lib = library.get()
    if lib is None:
        raise RuntimeError("the q8 products are not available on this machine")
    return lib

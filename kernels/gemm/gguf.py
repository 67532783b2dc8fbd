"""Weights kept as the GGUF file stores them (every block type of llama.cpp's quantization presets:
``TYPES``), for fp32 models on the CPU.

Dequantized to fp32 at load, a 4.5-bit weight takes 32 bits: seven times the bytes that every decode step
reads, and seven times the memory. ``GgufWeight`` holds the file's blocks instead. A product of a few rows
(a decode step) runs ``gguf_blocks.c``, which decodes each block in registers as it reads it, into
exactly the fp32 values the reference decoder gives (``runtime.model.weights.gguf_dequant``), so only the order
of each dot product's sum differs from the dense fp32 product. A product of many rows (a prefill) is
bound by arithmetic, not by reading the weight: the matrix is decoded, by the same kernel, into a
reused buffer (a tile of rows at a time where it is larger) that torch's own GEMM multiplies.

A fused linear (q|k|v, gate|up) is held as its row segments, each with its own block type, as the file
gives them. Gate: this process's C kernels (``capability.CpuPaths.kernel_isa``) and a C compiler.
"""
from __future__ import annotations

import ctypes
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

import torch
from torch.nn import functional as F

from actorserve.kernels.gemm.rows_product import ROWS, RowsProduct
from actorserve.kernels.native import CpuKernelLibrary
from actorserve.kernels.profiling import call

SOURCE = Path(__file__).with_name("gguf_blocks.c")
MAX_ROWS = 8  # as in the C source
# Past this many rows a product decodes the weight a tile at a time for torch's GEMM (arithmetic-bound);
# up to it, the kernel reads the blocks once per MAX_ROWS rows.
DECODED_ABOVE_ROWS = 32
TILE_VALUES = 1 << 20  # the decode buffer: 4 MiB of fp32, so that a decoded tile is read back from cache
# ggml's type number, the values of one block and its bytes, per type the kernel decodes (gguf_decode.h)
TYPES = {"Q4_0": (2, 32, 18), "Q4_1": (3, 32, 20), "Q5_0": (6, 32, 22), "Q5_1": (7, 32, 24), "Q8_0": (8, 32, 34),
         "IQ4_NL": (20, 32, 18), "MXFP4": (39, 32, 17), "Q2_K": (10, 256, 84), "Q3_K": (11, 256, 110),
         "Q4_K": (12, 256, 144), "Q5_K": (13, 256, 176), "Q6_K": (14, 256, 210), "IQ4_XS": (23, 256, 136)}

_library = CpuKernelLibrary(SOURCE, {
    "gguf_linear_f32": (ctypes.c_int, [ctypes.c_int, ctypes.c_void_p, ctypes.c_int64] + [ctypes.c_void_p] * 3
                        + [ctypes.c_int64] * 3 + [ctypes.c_int]),
    "gguf_dequantize_f32": (ctypes.c_int, [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p] + [ctypes.c_int64] * 2
                            + [ctypes.c_int]),
})


def available() -> bool:
    return _library.get() is not None


def keeps(type_name: str, shape: tuple[int, ...]) -> bool:
    """Whether a GGUF tensor of this type and (row-major) shape can be held as stored; the gate alone."""
    return type_name in TYPES and len(shape) == 2 and shape[1] % TYPES[type_name][1] == 0 and available()


@dataclass
class Segment:
    """Rows [start, start + rows) of the weight: ``blocks`` [rows, K / 32 * block bytes] uint8."""

    type_name: str
    blocks: torch.Tensor
    start: int
    rows: int


class GgufWeight:
    """A weight [out_features, in_features] as GGUF blocks, in row segments that cover it in order (all
    ``out_features`` rows of it, where that is given)."""

    def __init__(self, segments: list[Segment], in_features: int, out_features: Optional[int] = None) -> None:
        at = 0
        for s in segments:
            _, values, nbytes = TYPES[s.type_name]
            if (s.start != at or s.blocks.dtype != torch.uint8 or not s.blocks.is_contiguous()
                    or in_features % values or tuple(s.blocks.shape) != (s.rows, in_features // values * nbytes)):
                raise ValueError(f"GgufWeight: segment at row {s.start} does not continue the weight in order")
            at += s.rows
        if not segments:
            raise ValueError("GgufWeight: at least one segment")
        if out_features is not None and at != out_features:
            raise ValueError(f"GgufWeight: {at} rows of blocks for a weight of {out_features}")
        self.segments, self.in_features, self.out_features = _merged(segments), in_features, at
        # each segment's kernel arguments, bound once: (type number, blocks, first row, rows)
        self._calls = [(TYPES[s.type_name][0], s.blocks.data_ptr(), s.start, s.rows) for s in self.segments]

    @property
    def nbytes(self) -> int:
        return sum(s.blocks.numel() for s in self.segments)

    def dequantize(self) -> torch.Tensor:
        """The fp32 matrix, the reference decoder's values."""
        out = torch.empty(self.out_features, self.in_features, dtype=torch.float32)
        for s in self.segments:
            self._decode(s.type_name, s.blocks, out[s.start:s.start + s.rows])
        return out

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """The fp32 rows at ``ids`` (any shape): an embedding lookup that decodes only what it gathers."""
        return gather_rows(ids, self.out_features, self.in_features, [(s.start, s.rows, s) for s in self.segments],
                           lambda s, local, into: self._decode(s.type_name, s.blocks.index_select(0, local), into))

    def apply(self, x: torch.Tensor, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
        rows = input_rows(x, self.in_features, "GgufWeight")
        if bias is not None:
            bias = bias.float().contiguous()
        out = torch.empty(rows.shape[0], self.out_features, dtype=torch.float32)
        if rows.shape[0] > DECODED_ABOVE_ROWS:
            self._decoded_product(rows, bias, out)
        else:
            for m0 in range(0, rows.shape[0], MAX_ROWS):
                self._product(rows[m0:m0 + MAX_ROWS], bias, out[m0:m0 + MAX_ROWS])
        return out.view(*x.shape[:-1], self.out_features)

    def rows_product(self, bias: Optional[torch.Tensor], dtype: torch.dtype) -> Optional[RowsProduct]:
        """``apply`` for the decode plan of an fp32 model (None for another dtype): up to MAX_ROWS rows (its
        own contiguous fp32) go straight to the kernel, more through ``apply``."""
        if dtype != torch.float32:
            return None
        bias = None if bias is None else bias.float().contiguous()

        into = self._bound_product(bias)

        def run(rows: torch.Tensor) -> torch.Tensor:
            if rows.shape[0] > MAX_ROWS:
                return self.apply(rows, bias)
            out = torch.empty(rows.shape[0], self.out_features, dtype=torch.float32)
            into(rows.data_ptr(), out.data_ptr(), rows.shape[0], torch.get_num_threads())
            return out
        return RowsProduct(ROWS, run, self.out_features, into=into, into_rows=MAX_ROWS)

    def _product(self, rows: torch.Tensor, bias: Optional[torch.Tensor], out: torch.Tensor) -> None:
        """At most MAX_ROWS contiguous rows, straight from the blocks, into contiguous rows of ``out``."""
        self._bound_product(bias)(rows.data_ptr(), out.data_ptr(), rows.shape[0], torch.get_num_threads())

    def _bound_product(self, bias: Optional[torch.Tensor]) -> Callable[[int, int, int, int], None]:
        """The kernel calls of a product with this bias, bound once: (x_p, out_p, t, threads) multiplies t
        contiguous fp32 rows at x_p into t contiguous rows at out_p, a segment's bias and output columns by
        pointer offset, not by views."""
        fn, n, k = _lib().gguf_linear_f32, self.out_features, self.in_features
        calls = [(type_id, blocks_p, None if bias is None else bias.data_ptr() + 4 * start, 4 * start, seg_rows)
                 for type_id, blocks_p, start, seg_rows in self._calls]

        def product(x_p: int, out_p: int, t: int, threads: int) -> None:
            for type_id, blocks_p, bias_p, offset, seg_rows in calls:
                if call("actorserve::gguf_linear_f32", fn, type_id, x_p, t, blocks_p, bias_p, out_p + offset, n,
                        seg_rows, k, threads) != 0:
                    raise RuntimeError(f"gguf_linear_f32 refused type {type_id} [{seg_rows}, {k}]")
        return product

    def _decoded_product(self, rows: torch.Tensor, bias: Optional[torch.Tensor], out: torch.Tensor) -> None:
        """Many rows: bound by arithmetic, so torch's GEMM on the weight decoded into this thread's scratch
        buffer, the whole matrix in one call where it fits (most do), else a tile of rows at a time; no
        fp32 copy of a weight outlives its product."""
        k = self.in_features
        step = max(1, TILE_VALUES // k)
        scratch = _scratch.get(min(step, self.out_features) * k).view(-1, k)
        pieces = [(s, r0, min(step, s.rows - r0)) for s in self.segments for r0 in range(0, s.rows, step)]
        if self.out_features <= step:  # one tile: every segment decoded side by side, one product
            for s, r0, n in pieces:
                self._decode(s.type_name, s.blocks[r0:r0 + n], scratch[s.start + r0:s.start + r0 + n])
            out.copy_(F.linear(rows, scratch, bias))
            return
        for s, r0, n in pieces:
            self._decode(s.type_name, s.blocks[r0:r0 + n], scratch[:n])
            at = s.start + r0
            out[:, at:at + n] = F.linear(rows, scratch[:n], None if bias is None else bias[at:at + n])

    def _decode(self, type_name: str, blocks: torch.Tensor, into: torch.Tensor) -> None:
        """Rows of blocks (contiguous) into as many contiguous fp32 rows."""
        n = blocks.shape[0]
        rc = call("actorserve::gguf_dequantize_f32", _lib().gguf_dequantize_f32, TYPES[type_name][0],
                  blocks.data_ptr(), into.data_ptr(), n, self.in_features, torch.get_num_threads())
        if rc != 0:
            raise RuntimeError(f"gguf_dequantize_f32 refused {type_name} [{n}, {self.in_features}]")


def input_rows(x: torch.Tensor, in_features: int, kind: str) -> torch.Tensor:
    """The fp32 input of a product as contiguous rows [T, in_features]; ValueError for another input."""
    if x.dtype != torch.float32 or x.shape[-1] != in_features:
        raise ValueError(f"{kind}: fp32 input of {in_features} features, got {x.dtype} {tuple(x.shape)}")
    return x.reshape(-1, in_features).contiguous()


def gather_rows(ids: torch.Tensor, out_features: int, in_features: int, parts: list[tuple[int, int, Any]],
                decode: Callable[[Any, torch.Tensor, torch.Tensor], None]) -> torch.Tensor:
    """The fp32 rows at ``ids`` (any shape) of a weight held as row parts ``(start, rows, part)`` in order:
    ``decode(part, local ids, into)`` decodes the part's rows at the (contiguous int64) local ids into as
    many contiguous rows. Only the gathered rows are decoded."""
    flat = ids.reshape(-1).to(torch.int64)
    if flat.numel() and (int(flat.min()) < 0 or int(flat.max()) >= out_features):
        raise IndexError(f"row index out of range: the table has {out_features} rows")
    out = torch.empty(flat.numel(), in_features, dtype=torch.float32)
    if len(parts) == 1:  # a table of one part (the usual): every id is a row of it
        decode(parts[0][2], flat.contiguous(), out)
        return out.view(*ids.shape, in_features)
    for start, rows, part in parts:
        where = ((flat >= start) & (flat < start + rows)).nonzero().view(-1)
        if where.numel() == 0:
            continue
        decoded = out if where.numel() == flat.numel() else torch.empty(where.numel(), in_features)
        decode(part, (flat[where] - start).contiguous(), decoded)
        if decoded is not out:
            out[where] = decoded
    return out.view(*ids.shape, in_features)


def _merged(segments: list[Segment]) -> list[Segment]:
    """Neighbouring segments of one block type joined into one (q|k|v and gate|up mostly are): one kernel
    call, and one pass of its threads, for each."""
    out: list[Segment] = []
    for s in segments:
        if out and out[-1].type_name == s.type_name:
            last = out.pop()
            s = Segment(s.type_name, torch.cat([last.blocks, s.blocks]), last.start, last.rows + s.rows)
        out.append(s)
    return out


class ThreadScratch(threading.local):
    """Each thread's work buffer of one dtype, grown as needed and reused: allocating it fresh for every
    product costs a page fault per 4 KiB written."""

    def __init__(self, dtype: torch.dtype) -> None:
        self.dtype, self.buffer = dtype, None

    def get(self, values: int) -> torch.Tensor:
        if self.buffer is None or self.buffer.numel() < values:
            self.buffer = torch.empty(values, dtype=self.dtype)
        return self.buffer[:values]


_scratch = ThreadScratch(torch.float32)  # the decoded tiles, at most TILE_VALUES floats


def _lib() -> ctypes.CDLL:
    lib = _library.get()
    if lib is None:
        raise RuntimeError("the GGUF block kernels are not available on this machine")
    return lib

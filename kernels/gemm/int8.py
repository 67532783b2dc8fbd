"""W8A8 int8 products: weights quantized once at load per output channel, activations per row at each call.

On a CPU with AVX-512 VNNI an int8 product runs at about twice the bf16 rate (on this project's 2-core
machine 750-800 against 370-410 GOP/s at 256 to 2048 rows, ``bench/gemm_paths.py``), and prefill and
large decode batches are bound by that rate. This is vLLM's dynamic int8 scheme (``--quantization int8``
here; vLLM's compressed-tensors W8A8 with dynamic per-token activation scales):

    w_q = round(w / s_w), s_w = amax(|w[n, :]|) / 127          (symmetric, per output channel, at load)
    x_q = round(x / s_x), s_x = amax(|x[m, :]|) / 127          (symmetric, per row, every call)
    y   = (x_q @ w_q.T) * s_x[m] * s_w[n] (+ bias)             (int32 products, exact; scaled in fp32)

The product itself is ``torch._int_mm`` (oneDNN's s8s8s32 GEMM; an int32 torch product where that does
not run). Without VNNI, oneDNN's integer sums saturate (``capability.CpuPaths.int_mm_exact``), so there
the product is ``int8_product`` of ``int8_bf16.c``, which puts the weight's signs on the activations so
that no sum saturates; and where the C kernels are off too, each weight is held as two parts,
w = 64 * hi + lo with lo in [-32, 31] and hi in [-2, 2], each narrow enough for oneDNN, and the product
is ``64 * (x_q @ hi) + x_q @ lo``. All three give the same integers. The two row passes around the
product are ``int8_bf16.c`` for bf16 activations, with the torch sequences below as their reference and
fallback. It is an approximation of the model (about 7 bits per activation), which is why it is opt-in:
greedy tokens follow the fp32 engine's for a median of 12 of 64 tokens on the benchmark prompts, bf16's
for 17 (``tests/kernels/gemm/test_int8.py`` bounds the products' and a layer's error). The lm_head stays
in the model's dtype, as in vLLM, since its rows are what the sampler ranks.
"""
from __future__ import annotations

import ctypes
from pathlib import Path
from typing import Optional

import torch

from actorserve.kernels import capability
from actorserve.kernels.gemm.rows_product import INT8, RowsProduct
from actorserve.kernels.native import CpuKernelLibrary
from actorserve.kernels.profiling import call

SOURCE = Path(__file__).with_name("int8_bf16.c")
QMAX = 127

_library = CpuKernelLibrary(SOURCE, {
    "quantize_rows_bf16": (None, [ctypes.c_void_p] * 3 + [ctypes.c_int64] * 2 + [ctypes.c_int]),
    "dequant_rows_bf16": (None, [ctypes.c_void_p] * 5 + [ctypes.c_int64] * 2 + [ctypes.c_int]),
    "silu_mul_quantize_rows": (ctypes.c_int, [ctypes.c_void_p] * 5 + [ctypes.c_int64] * 2 + [ctypes.c_int]),
    "dequant_add_norm_quantize_rows": (ctypes.c_int, [ctypes.c_void_p] * 7 + [ctypes.c_float] + [ctypes.c_void_p] * 2
                                       + [ctypes.c_int64] * 2 + [ctypes.c_int]),
    "int8_product": (None, [ctypes.c_void_p] * 3 + [ctypes.c_int64] * 3 + [ctypes.c_int]),
})


def int_mm_available() -> bool:
    """This process's gate of the int8 product (``capability.CpuPaths.int_mm``); without it the product runs
    in int32 through torch's generic matmul: the same integers, slower."""
    return capability.current().int_mm


def int_mm_exact() -> bool:
    """This process's gate of one ``torch._int_mm`` per product (``capability.CpuPaths.int_mm_exact``)."""
    return capability.current().int_mm_exact


SPLIT = 64  # w = SPLIT * hi + lo: |lo| <= 32, |hi| <= 2, so no byte-pair sum of either part saturates


def split(q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """int8 q -> (hi, lo), both int8, q = SPLIT * hi + lo exactly."""
    wide = q.to(torch.int16)
    lo = (wide + SPLIT // 2) % SPLIT - SPLIT // 2
    return ((wide - lo) // SPLIT).to(torch.int8), lo.to(torch.int8)


def kernels_available() -> bool:
    return _library.get() is not None


def library() -> Optional[ctypes.CDLL]:
    """The built row passes with their signatures declared, for callers that plan a whole step on raw
    pointers (``runtime.model.execution.decode_fast_path``); None where they are not available."""
    return _library.get()


def quantize_ref(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] -> (int8 [M, K], fp32 scales [M]); a row of zeros gets scale 0 and zeros."""
    xf = x.float()
    amax = xf.abs().amax(dim=-1)
    # a true division, as the C pass does (``QMAX / amax`` would be ``amax.reciprocal() * QMAX`` in torch)
    inv = torch.where(amax > 0, torch.full_like(amax, QMAX) / amax, torch.zeros_like(amax))
    q = (xf * inv[:, None]).round().clamp(-QMAX, QMAX).to(torch.int8)
    return q, amax / QMAX


def dequant_ref(acc: torch.Tensor, sx: torch.Tensor, sw: torch.Tensor, bias: Optional[torch.Tensor],
                dtype: torch.dtype) -> torch.Tensor:
    y = acc.float() * sx[:, None] * sw
    if bias is not None:
        y = y + bias.float()
    return y.to(dtype)


def _fast(dtype: torch.dtype, bias: Optional[torch.Tensor] = None) -> bool:
    """The gate of the C row passes: bf16 activations (and bias), on a CPU they were built for."""
    return dtype == torch.bfloat16 and (bias is None or bias.dtype == torch.bfloat16) and kernels_available()


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``quantize_ref`` of a 2-D x, in one C pass for bf16."""
    if not _fast(x.dtype) or x.requires_grad:
        return quantize_ref(x)
    x = x.contiguous()
    rows, k = x.shape
    q = torch.empty(rows, k, dtype=torch.int8)
    scale = torch.empty(rows, dtype=torch.float32)
    call("actorserve::quantize_rows_bf16", _library.get().quantize_rows_bf16, x.data_ptr(), q.data_ptr(),
         scale.data_ptr(), rows, k, torch.get_num_threads())
    return q, scale


def dequant_rows(acc: torch.Tensor, sx: torch.Tensor, sw: torch.Tensor, bias: Optional[torch.Tensor],
                 dtype: torch.dtype) -> torch.Tensor:
    """``dequant_ref``, in one C pass for a bf16 result."""
    if not _fast(dtype, bias):
        return dequant_ref(acc, sx, sw, bias, dtype)
    rows, n = acc.shape
    out = torch.empty(rows, n, dtype=torch.bfloat16)
    call("actorserve::dequant_rows_bf16", _library.get().dequant_rows_bf16, acc.data_ptr(), sx.data_ptr(),
         sw.data_ptr(), None if bias is None else bias.contiguous().data_ptr(), out.data_ptr(), rows, n,
         torch.get_num_threads())
    return out


def silu_mul_quantize_ref(acc: torch.Tensor, sx: torch.Tensor, sw: torch.Tensor,
                          dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """A gated MLP's middle between its two int8 products: the gate_up product [M, 2n] dequantized, SiLU of
    the gate times the up half, quantized per row for the down projection."""
    from actorserve.kernels.elementwise import silu_mul  # the activation the unquantized MLP uses, bit for bit

    return quantize_rows(silu_mul(dequant_rows(acc, sx, sw, None, dtype)))


def silu_mul_quantize(acc: torch.Tensor, sx: torch.Tensor, sw: torch.Tensor,
                      dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """``silu_mul_quantize_ref`` in one C pass for bf16 activations: at 2048 prefill rows the three passes
    write and re-read 19 MB of bf16 rows per layer."""
    if not _fast(dtype) or acc.shape[1] % 2:
        return silu_mul_quantize_ref(acc, sx, sw, dtype)
    rows, n = acc.shape[0], acc.shape[1] // 2
    q = torch.empty(rows, n, dtype=torch.int8)
    scale = torch.empty(rows, dtype=torch.float32)
    rc = call("actorserve::silu_mul_quantize_rows", _library.get().silu_mul_quantize_rows, acc.data_ptr(),
              sx.data_ptr(), sw.data_ptr(), q.data_ptr(), scale.data_ptr(), rows, n, torch.get_num_threads())
    if rc != 0:
        raise MemoryError("silu_mul_quantize_rows: no memory for a row buffer")
    return q, scale


def dequant_add_norm_quantize_ref(acc: torch.Tensor, sx: torch.Tensor, sw: torch.Tensor, bias: Optional[torch.Tensor],
                                  residual: torch.Tensor, weight: torch.Tensor, eps: float,
                                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The seam between two int8 products of a layer: the first's result dequantized, added into the
    residual stream and normalised, then quantized for the next. Returns (new residual, int8 rows, scales)."""
    from actorserve.kernels.elementwise import add_rms_norm  # the residual add + norm of the unquantized layer, bit for bit

    h, normed = add_rms_norm(residual, dequant_rows(acc, sx, sw, bias, residual.dtype), weight, eps)
    return (h, *quantize_rows(normed))


def dequant_add_norm_quantize(acc: torch.Tensor, sx: torch.Tensor, sw: torch.Tensor, bias: Optional[torch.Tensor],
                              residual: torch.Tensor, weight: torch.Tensor, eps: float,
                              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``dequant_add_norm_quantize_ref`` in one C pass for bf16 (three passes and two bf16 row tensors
    fewer per seam; a decode step of the int8 fast path has two seams a layer)."""
    rows, n = acc.shape
    if (not _fast(residual.dtype, bias) or weight.dtype != torch.bfloat16 or residual.shape != (rows, n)
            or weight.shape != (n,)):
        return dequant_add_norm_quantize_ref(acc, sx, sw, bias, residual, weight, eps)
    res_in, w = residual.contiguous(), weight.contiguous()
    h = torch.empty_like(res_in)
    q, scale = torch.empty(rows, n, dtype=torch.int8), torch.empty(rows, dtype=torch.float32)
    rc = call("actorserve::dequant_add_norm_quantize_rows", _library.get().dequant_add_norm_quantize_rows,
              acc.contiguous().data_ptr(), sx.data_ptr(), sw.data_ptr(),
              None if bias is None else bias.contiguous().data_ptr(), res_in.data_ptr(), h.data_ptr(), w.data_ptr(),
              eps, q.data_ptr(), scale.data_ptr(), rows, n, torch.get_num_threads())
    if rc != 0:
        raise MemoryError("dequant_add_norm_quantize_rows: no memory for a row buffer")
    return h, q, scale


class Int8Weight:
    """A weight [out_features, in_features] as int8 with one fp32 scale per output channel."""

    def __init__(self, weight: torch.Tensor) -> None:
        if weight.dim() != 2 or weight.device.type != "cpu" or not weight.is_floating_point():
            raise ValueError(f"Int8Weight: a floating-point CPU matrix, got {weight.dtype} {tuple(weight.shape)} "
                             f"on {weight.device}")
        self.out_features, self.in_features = weight.shape
        q, self.scale = quantize_ref(weight.detach())
        # _int_mm takes [K, N]; the transposed view of [N, K] rows is oneDNN's faster layout at few rows.
        # Where one _int_mm would saturate, the C product takes the same [N, K] rows; without the C kernels
        # only the two parts are held (``split``).
        self.halves: Optional[tuple[torch.Tensor, torch.Tensor]] = None
        self._q_t: Optional[torch.Tensor] = q.t()
        self._own_product = not int_mm_exact() and kernels_available()
        if int_mm_available() and not int_mm_exact() and not self._own_product:
            hi, lo = split(q)
            self.halves, self._q_t = (hi.t(), lo.t()), None

    @property
    def q_t(self) -> torch.Tensor:
        """The int8 weight [K, N]."""
        if self._q_t is not None:
            return self._q_t
        hi, lo = self.halves
        return (hi.to(torch.int16) * SPLIT + lo).to(torch.int8)

    def _int_mm(self, q: torch.Tensor, out: Optional[torch.Tensor] = None) -> torch.Tensor:
        if self._own_product:
            rows = q.shape[0]
            acc = out if out is not None and out.is_contiguous() else torch.empty(
                rows, self.out_features, dtype=torch.int32)
            call("actorserve::int8_product", _library.get().int8_product, q.contiguous().data_ptr(),
                 self._q_t.data_ptr(), acc.data_ptr(), rows, self.out_features, self.in_features,
                 torch.get_num_threads())
            return out.copy_(acc) if out is not None and out is not acc else acc
        if self.halves is None:
            return torch._int_mm(q, self._q_t, out=out)
        hi, lo = self.halves
        acc = torch._int_mm(q, lo, out=out)
        return acc.add_(torch._int_mm(q, hi), alpha=SPLIT)

    def apply(self, x: torch.Tensor, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
        """``F.linear(x, w, bias)`` for the dequantized w, with x quantized per row; x keeps its dtype."""
        rows = self._rows(x)
        if rows.shape[0] == 0:
            return x.new_empty(*x.shape[:-1], self.out_features)
        acc, sx = self.product_quantized(*quantize_rows(rows))
        return dequant_rows(acc, sx, self.scale, bias, x.dtype).view(*x.shape[:-1], self.out_features)

    def product(self, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The int32 product of rows [M, K] (quantized here) and the row scales: ``apply`` before its
        dequantization, for a caller that fuses that with what comes next."""
        return self.product_quantized(*quantize_rows(self._rows(rows)))

    def product_quantized(self, q: torch.Tensor, sx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The int32 product of rows already quantized (int8 [M, K], scales [M])."""
        if q.dtype != torch.int8 or q.dim() != 2 or q.shape[1] != self.in_features or sx.shape != (q.shape[0],):
            raise ValueError(f"int8 product: int8 rows of {self.in_features} and one scale each, got {q.dtype} "
                             f"{tuple(q.shape)} and {tuple(sx.shape)}")
        if q.shape[0] == 0:
            return torch.empty(0, self.out_features, dtype=torch.int32), sx
        if int_mm_available() or self._own_product:
            return self._int_mm(q), sx
        return torch.mm(q.to(torch.int32), self.q_t.to(torch.int32)), sx

    def apply_quantized(self, q: torch.Tensor, sx: torch.Tensor, dtype: torch.dtype,
                        bias: Optional[torch.Tensor] = None) -> torch.Tensor:
        """``apply`` of rows already quantized, the result in ``dtype``."""
        acc, sx = self.product_quantized(q, sx)
        return dequant_rows(acc, sx, self.scale, bias, dtype)

    def rows_product(self, bias: Optional[torch.Tensor], dtype: torch.dtype) -> Optional[RowsProduct]:
        """The product on rows the pass before it quantized, its integers left for the pass after it: where
        an integer product (``torch._int_mm`` or ``int8_product``) and the row passes run, in a bf16 model
        (the passes' dtype, a bias's too)."""
        if (dtype != torch.bfloat16 or not (kernels_available() and (int_mm_available() or self._own_product))
                or (bias is not None and bias.dtype != torch.bfloat16)):
            return None
        return RowsProduct(INT8, lambda q, acc: self._int_mm(q, out=acc), self.out_features, self.scale,
                           None if bias is None else bias.contiguous())

    def _rows(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] != self.in_features:
            raise ValueError(f"int8 linear: input of {self.in_features} features, got {tuple(x.shape)}")
        return x.reshape(-1, self.in_features)

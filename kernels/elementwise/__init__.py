"""The row operations of a decoder layer (RMSNorm, residual add + RMSNorm, SiLU-and-multiply, rotary) and
the greedy sampler's row argmax: a C path for bf16 and fp32 rows on CPUs with AVX2 or AVX-512 BF16
(``cpu_rows``), triton kernels for rows on a GPU (``kernels.elementwise.rows_triton``, where triton is installed),
and torch references, which are also the path for everything else. In bf16
the C path rounds where torch's sequence rounds, so it is torch's to the bit; in fp32 only the order of a
norm's sum of squares and the last bit of exp differ from torch's."""
from __future__ import annotations

import torch
from torch.nn import functional as F

from actorserve.kernels import triton_route
from actorserve.kernels.elementwise import cpu_rows


def _on_triton(x: torch.Tensor):
    """The triton row kernels for a tensor on a GPU, where triton is installed; else None."""
    return triton_route.for_tensor(x, f"{__name__}.rows_triton")


def rms_norm_ref(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' order: normalise in fp32, cast back, then scale by the weight in the model dtype."""
    if x.dtype == torch.float32:
        return F.rms_norm(x, weight.shape, weight, eps)
    return weight * F.rms_norm(x.float(), weight.shape, eps=eps).to(x.dtype)


def silu_mul_ref(gate_up: torch.Tensor) -> torch.Tensor:
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def rotary_ref(x: torch.Tensor, table: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """Rotate-half rotary embedding of x [T, heads, D] by the step's (cos, signed sin) [T, 1, D]:
    rotate_half(x) * sin equals roll(x, D/2) * sin with sin's first half negated."""
    cos, sin_signed = table
    return x * cos + x.roll(x.shape[-1] // 2, dims=-1) * sin_signed


def rotary(x: torch.Tensor, table: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    if cpu_rows.rotary_applies(x, *table):
        return cpu_rows.rotary(x, *table)
    return rotary_ref(x, table)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    if (gpu := _on_triton(x)) is not None:
        return gpu.rms_norm(x, weight, eps)
    if cpu_rows.applies(x, weight):
        return cpu_rows.rms_norm(x, weight, eps)
    return rms_norm_ref(x, weight, eps)


def add_rms_norm(x: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor,
                 eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(x + delta, rms_norm(x + delta)): the residual stream and the next sublayer's input."""
    if (gpu := _on_triton(x)) is not None:
        return gpu.rms_norm(x, weight, eps, delta=delta)
    if cpu_rows.applies(x, weight, delta):
        return cpu_rows.add_rms_norm(x, delta, weight, eps)
    h = x + delta
    return h, rms_norm_ref(h, weight, eps)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    if (gpu := _on_triton(gate_up)) is not None:
        return gpu.silu_mul(gate_up)
    if cpu_rows.applies(gate_up):
        return cpu_rows.silu_mul(gate_up)
    return silu_mul_ref(gate_up)


def argmax(x: torch.Tensor) -> torch.Tensor:
    """``x.argmax(dim=-1)`` for 2-D x: bf16 or fp32 logits in one vectorised pass over each row (torch's
    argmax of a row reduces it with a scalar loop, and ranks bf16 through an fp32 copy)."""
    if x.dim() == 2 and x.shape[1] > 0 and cpu_rows.applies(x):
        return cpu_rows.argmax(x)
    return x.argmax(dim=-1)


__all__ = ["add_rms_norm", "argmax", "rms_norm", "rms_norm_ref", "rotary", "rotary_ref", "silu_mul", "silu_mul_ref"]

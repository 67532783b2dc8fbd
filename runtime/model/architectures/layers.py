"""Layers shared by the decoder architectures, written to match transformers' numerics in fp32."""
from __future__ import annotations

import math
from typing import Any, Optional

import torch
import torch.nn.functional as F
from torch import nn

from actorserve.kernels.elementwise import add_rms_norm, rms_norm, rotary, silu_mul
from actorserve.kernels.gemm import Int8Weight, PreparedWeight, int8, linear, prepacked
from actorserve.kernels.gemm import gguf_q8
from actorserve.kernels.gemm.gguf import GgufWeight, Segment
from actorserve.kernels.gemm.gguf_q8 import GgufQ8Weight
from actorserve.kernels.gemm.rows_product import ROWS, RowsProduct



class Linear(nn.Linear):
    """nn.Linear whose product goes through ``kernels.gemm.linear``. After ``prepack`` a bf16 CPU weight
    is held in oneDNN's blocked layout only, after ``quantize_int8`` as int8 only, after ``hold_blocks``
    as GGUF blocks only (``weight`` is None)."""

    packed: Optional[PreparedWeight] = None

    def quantize_int8(self) -> bool:
        """Hold the weight as int8 (``kernels.gemm.int8``); once, after loading, before ``prepack``."""
        if self.weight is None or self.weight.device.type != "cpu":
            return False
        self.packed = Int8Weight(self.weight.detach())
        self.weight = None
        return True

    def hold_blocks(self, segments: list[Segment]) -> None:
        """Hold the weight as the GGUF file's blocks (``kernels.gemm.gguf``), in place of the fp32 matrix;
        at load, where every row of the weight came as blocks."""
        self.packed = GgufWeight(segments, self.in_features, self.out_features)
        self.weight = None

    def hold_q8_products(self) -> bool:
        """Multiply the GGUF blocks by int8-quantized activations (``kernels.gemm.gguf_q8``), where the
        weight is of block types those products take; after ``hold_blocks``."""
        if not isinstance(self.packed, GgufWeight) or not gguf_q8.takes(self.packed):
            return False
        self.packed = GgufQ8Weight(self.packed)
        return True

    def prepack(self) -> bool:
        """Pack the weight where that path takes it; once, after loading."""
        if self.weight is None or not prepacked.applies(self.weight):
            return False
        self.packed = prepacked.PackedWeight(self.weight.detach())
        self.weight = None  # nothing else reads a linear's weight
        return True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias, self.packed)

    def rows_product(self, dtype: torch.dtype) -> RowsProduct:
        """This linear's product in the decode plan of a ``dtype`` model: its weight kind's own where that
        gives one, else this module's ``forward`` on rows of ``dtype``."""
        bind = getattr(self.packed, "rows_product", None)
        product = bind(self.bias, dtype) if bind is not None else None
        return product if product is not None else RowsProduct(ROWS, self.forward, self.out_features)


class Embedding(nn.Embedding):
    """nn.Embedding that may hold its table as GGUF blocks (``hold_blocks``): a lookup then decodes just
    the rows it gathers, the values the fp32 table would hold, and a tied lm_head multiplies by the same
    blocks."""

    blocks: Optional[GgufWeight | GgufQ8Weight] = None

    def hold_blocks(self, segments: list[Segment]) -> None:
        self.blocks = GgufWeight(segments, self.embedding_dim, self.num_embeddings)
        self.weight = None

    def hold_q8_products(self) -> bool:
        """The table repacked for the q8 products (of a tied lm_head), which lookups decode too."""
        if not isinstance(self.blocks, GgufWeight) or not gguf_q8.takes(self.blocks):
            return False
        self.blocks = GgufQ8Weight(self.blocks)
        return True

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return super().forward(input_ids) if self.blocks is None else self.blocks.rows(input_ids)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)  # transformers' numerics (kernels.elementwise.rms_norm_ref)

    def add_forward(self, x: torch.Tensor, delta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The residual x + delta, and its normalisation, in one pass where the fused kernel runs."""
        return add_rms_norm(x, delta, self.weight, self.eps)

    def decode_plan(self, planner, delta, form: str, name: str):
        """``add_forward`` of the residual stream and ``delta`` (``forward`` of the stream where delta is
        None), its result in the form the next product takes."""
        return planner.add_rms_norm(self, delta, form, name)


class GatedMLP(nn.Module):
    def __init__(self, hidden: int, intermediate: int, act: str = "silu") -> None:
        super().__init__()
        self.gate_up_proj = Linear(hidden, 2 * intermediate, bias=False)  # gate_proj and up_proj, one GEMM
        self.down_proj = Linear(intermediate, hidden, bias=False)
        self.act = act  # "silu", or "gelu_tanh" (Gemma's GELU, tanh approximation)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.act == "gelu_tanh":
            gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
            return self.down_proj(F.gelu(gate, approximate="tanh") * up)
        gate_up, down = self.gate_up_proj.packed, self.down_proj.packed
        if isinstance(gate_up, Int8Weight) and isinstance(down, Int8Weight):
            # int8 both sides: the activation runs on the int32 product and hands down_proj int8 rows
            rows = x.reshape(-1, x.shape[-1])
            acc, sx = gate_up.product(rows)
            q, s = int8.silu_mul_quantize(acc, sx, gate_up.scale, x.dtype)
            return down.apply_quantized(q, s, x.dtype).view(*x.shape[:-1], down.out_features)
        return self.down_proj(silu_mul(self.gate_up_proj(x)))

    def decode_plan(self, planner, x):
        """``forward`` in the decode plan; with int8 on both sides the activation runs on the int32
        product and hands down_proj int8 rows, as here."""
        gate_up = planner.product(self.gate_up_proj, x, "gate_up")
        act = planner.silu_mul(gate_up, planner.takes(self.down_proj), "act")
        return planner.product(self.down_proj, act, "down")


def rope_inv_freq(head_dim: int, theta: float, scaling: Optional[dict[str, Any]],
                  freq_factors: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Inverse frequencies of rotary embedding, with llama3, linear or YaRN scaling, or GGUF per-frequency
    factors."""
    if scaling is not None and scaling.get("rope_type", scaling.get("type")) == "yarn":
        return _yarn_inv_freq(head_dim, theta, scaling)
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    if freq_factors is not None:
        inv_freq = inv_freq / freq_factors.float()
    if scaling is None:
        return inv_freq
    kind = scaling.get("rope_type", scaling.get("type"))
    if kind == "llama3":
        return _llama3_inv_freq(inv_freq, scaling)
    if kind == "linear":
        return inv_freq / float(scaling["factor"])
    raise ValueError(f"unsupported rope scaling {kind!r}; supported: llama3, linear, yarn")


def _yarn_inv_freq(dim: int, theta: float, s: dict[str, Any]) -> torch.Tensor:
    """YaRN: interpolated frequencies below the correction range, extrapolated above it, a linear ramp
    between (transformers' numerics, in fp32)."""
    factor, old_len = float(s["factor"]), float(s["original_max_position_embeddings"])
    beta_fast, beta_slow = s.get("beta_fast") or 32, s.get("beta_slow") or 1

    def correction_dim(rotations: float) -> float:
        return (dim * math.log(old_len / (rotations * 2 * math.pi))) / (2 * math.log(theta))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if s.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    pos_freqs = theta ** (torch.arange(0, dim, 2).float() / dim)
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / ((high + 0.001 if low == high else high) - low))
    extrapolation = 1 - ramp.clamp(0, 1)
    return (1.0 / (factor * pos_freqs)) * (1 - extrapolation) + (1.0 / pos_freqs) * extrapolation


def _llama3_inv_freq(inv_freq: torch.Tensor, s: dict[str, Any]) -> torch.Tensor:
    factor, low, high = float(s["factor"]), float(s["low_freq_factor"]), float(s["high_freq_factor"])
    old_len = float(s["original_max_position_embeddings"])
    low_wavelen, high_wavelen = old_len / low, old_len / high
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, scaled)


class RotaryEmbedding(nn.Module):
    """Rotate-half rotary embedding with a cos/sin table computed once for every position.

    ``rotate_half(x) * sin`` equals ``roll(x, D/2) * sin_signed`` with the first half of sin negated, so
    applying it costs one roll instead of two slices, a negation and a concatenation (same values)."""

    def __init__(self, head_dim: int, max_positions: int, inv_freq: torch.Tensor, scale: float = 1.0) -> None:
        super().__init__()
        positions = torch.arange(max_positions, dtype=torch.float32)
        freqs = positions[:, None] * inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        sin = emb.sin() * scale  # (YaRN's attention factor scales both tables; 1 elsewhere)
        half = head_dim // 2
        self.register_buffer("cos", emb.cos() * scale, persistent=False)
        self.register_buffer("sin_signed", torch.cat((-sin[:, :half], sin[:, half:]), dim=-1), persistent=False)

    def table(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and signed sin [T, 1, D] for the step's positions, looked up once and shared by every layer."""
        return self.cos[positions][:, None, :].to(dtype), self.sin_signed[positions][:, None, :].to(dtype)


def apply_rotary(x: torch.Tensor, table: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """x [T, heads, D] rotated by the step's table (``kernels.elementwise.rotary_ref`` gives the numerics)."""
    return rotary(x, table)

"""A decode-only step of a bf16 model on the CPU kernels, with its dispatch resolved once at load.

At batch 1 a decode step of SmolLM2-135M spent about 5 ms of its ~25 in Python between kernels: some 240
module calls, a gate per kernel call (bf16? on the CPU? without grad?), wrappers that reshape their
inputs and re-derive strides, and 300 small allocations. None of that changes between the steps of a
loaded model. ``DecodeFastPath`` binds each layer's weights, norm weights and kernels once; a step is then
a loop of kernel calls on pointers into a few buffers allocated per step.

It computes what the module path (``CausalLM.forward``) computes, with the same kernels on the same
operands in the same order, so its hidden states are the module path's bit for bit (tested). It serves
only the steps the module path would send to those kernels: every scheduled chunk a decode, a bf16 model
whose attention is ``CpuDecodeBackend``'s and whose row operations are ``fused_bf16.c``'s. Prefill and
mixed steps, fp32 and other devices take the module path. Products go to the weight's own kernel
(prepacked bf16 or int8); a layer whose MLP is int8 on both sides keeps the fused int8 middle.
"""
from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Callable, Optional

import torch
from torch.nn import functional as F

from kernels.attention import cpu_decode
from kernels.elementwise import cpu_bf16, rotary
from kernels.gemm import Int8Weight, PackedWeight, int8
from kernels.profiling import call
from runtime.model.decoder import CausalLM, DecoderLayer
from runtime.model.layers import Linear

Product = Callable[[torch.Tensor], torch.Tensor]


def _product(linear: Linear) -> Product:
    """The linear's product as one call on 2-D rows, straight to its weight's kernels where those are
    oneDNN's prepacked bf16 or the int8 passes (``packed_linear`` and ``Int8Weight.apply`` less their
    checks and reshapes: the rows here are the plan's own contiguous bf16)."""
    packed, bias = linear.packed, linear.bias
    if isinstance(packed, PackedWeight):
        op, tensor = torch.ops.mkldnn._linear_pointwise.default, packed.tensor
        return lambda rows: op(rows, tensor, bias, "none", [], "")
    lib = int8.library()
    if isinstance(packed, Int8Weight) and lib is not None and (bias is None or bias.dtype == torch.bfloat16):
        quantize, dequant = _int8_quantize(lib, packed.in_features), lib.dequant_rows_bf16
        q_t, sw, n = packed.q_t, packed.scale.data_ptr(), packed.out_features
        bias_p = None if bias is None else bias.contiguous().data_ptr()

        def product(rows: torch.Tensor) -> torch.Tensor:
            q, sx = quantize(rows)
            acc, t = torch._int_mm(q, q_t), rows.shape[0]
            out = torch.empty(t, n, dtype=torch.bfloat16)
            call("actorserve::dequant_rows_bf16", dequant, acc.data_ptr(), sx.data_ptr(), sw, bias_p, out.data_ptr(),
                 t, n, torch.get_num_threads())
            return out
        return product
    return linear.forward


def _int8_quantize(lib: ctypes.CDLL, k: int) -> Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
    """``int8.quantize_rows`` of contiguous bf16 rows [T, k]."""
    fn = lib.quantize_rows_bf16

    def quantize(rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        t = rows.shape[0]
        q, sx = torch.empty(t, k, dtype=torch.int8), torch.empty(t, dtype=torch.float32)
        call("actorserve::quantize_rows_bf16", fn, rows.data_ptr(), q.data_ptr(), sx.data_ptr(), t, k,
             torch.get_num_threads())
        return q, sx
    return quantize


def _int8_mlp(gate_up: Int8Weight, down: Int8Weight, lib: ctypes.CDLL) -> Product:
    """``GatedMLP.forward`` with both linears int8 (the fused middle), on contiguous bf16 rows [T, hidden]."""
    quantize, middle, dequant = _int8_quantize(lib, gate_up.in_features), lib.silu_mul_quantize_rows, lib.dequant_rows_bf16
    gu_t, gu_s, inter = gate_up.q_t, gate_up.scale.data_ptr(), gate_up.out_features // 2
    d_t, d_s, hidden = down.q_t, down.scale.data_ptr(), down.out_features

    def mlp(rows: torch.Tensor) -> torch.Tensor:
        t, threads = rows.shape[0], torch.get_num_threads()
        q, sx = quantize(rows)
        acc = torch._int_mm(q, gu_t)
        q2, s2 = torch.empty(t, inter, dtype=torch.int8), torch.empty(t, dtype=torch.float32)
        rc = call("actorserve::silu_mul_quantize_rows", middle, acc.data_ptr(), sx.data_ptr(), gu_s, q2.data_ptr(),
                  s2.data_ptr(), t, inter, threads)
        if rc != 0:
            raise MemoryError("silu_mul_quantize_rows: no memory for a row buffer")
        acc2 = torch._int_mm(q2, d_t)
        out = torch.empty(t, hidden, dtype=torch.bfloat16)
        call("actorserve::dequant_rows_bf16", dequant, acc2.data_ptr(), s2.data_ptr(), d_s, None, out.data_ptr(), t,
             hidden, threads)
        return out
    return mlp


@dataclass
class _LayerPlan:
    in_norm: int  # data_ptr of the norms' weights
    post_norm: int
    eps_in: float
    eps_post: float
    qkv: Product
    o: Product
    gate_up: Optional[Product]  # None where the MLP runs as one call (int8 both sides)
    down: Optional[Product]
    mlp: Product
    q_norm: Optional[torch.nn.Module]
    k_norm: Optional[torch.nn.Module]


class DecodeFastPath:
    """Built by ``build`` where every gate of the path holds; ``applies`` is checked each step."""

    def __init__(self, model: CausalLM, elementwise: ctypes.CDLL, attention: ctypes.CDLL) -> None:
        cfg = model.cfg
        self.model, self.ew, self.attn = model, elementwise, attention
        self.heads, self.kv_heads, self.head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.hidden, self.intermediate = cfg.hidden_size, cfg.intermediate_size
        self.q_size, self.kv_size = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
        self.scale = cfg.head_dim ** -0.5
        # the module path casts the fp32 tables' rows each step; cast once, the values are the same
        self.cos = model.rotary.cos.to(torch.bfloat16)
        self.sin = model.rotary.sin_signed.to(torch.bfloat16)
        self.embed = model.model.embed_tokens.weight if model.stage.first else None
        self.final_norm = model.model.norm if model.stage.last else None
        self.layers = [self._plan(layer) for layer in model.model.layers.values()]

    @classmethod
    def build(cls, model: CausalLM, backend: object) -> Optional["DecodeFastPath"]:
        """The path for this model and backend, or None where a gate fails (the module path serves all)."""
        ew, attn = cpu_bf16.library(), cpu_decode.library()
        if (ew is None or attn is None or not isinstance(backend, cpu_decode.CpuDecodeBackend)
                or model.dtype != torch.bfloat16 or next(model.parameters()).device.type != "cpu"
                or model.rotary is None or len(model.model.layers) == 0
                or not all(isinstance(m, DecoderLayer) for m in model.model.layers.values())):
            return None
        return cls(model, ew, attn)

    def _plan(self, layer: DecoderLayer) -> _LayerPlan:
        attn, mlp = layer.self_attn, layer.mlp
        fused_int8 = isinstance(mlp.gate_up_proj.packed, Int8Weight) and isinstance(mlp.down_proj.packed, Int8Weight)
        lib = int8.library()
        whole = _int8_mlp(mlp.gate_up_proj.packed, mlp.down_proj.packed, lib) if fused_int8 and lib else mlp.forward
        return _LayerPlan(
            in_norm=layer.input_layernorm.weight.data_ptr(), post_norm=layer.post_attention_layernorm.weight.data_ptr(),
            eps_in=layer.input_layernorm.eps, eps_post=layer.post_attention_layernorm.eps,
            qkv=_product(attn.qkv_proj), o=_product(attn.o_proj),
            gate_up=None if fused_int8 else _product(mlp.gate_up_proj),
            down=None if fused_int8 else _product(mlp.down_proj), mlp=whole,
            q_norm=attn.q_norm, k_norm=attn.k_norm)

    @staticmethod
    def applies(meta: object) -> bool:
        """Whether this step is one the path serves: decodes only (``CpuDecodeBackend.prepare``'s plan)."""
        return getattr(meta, "prefill", True) is None and getattr(meta, "decode", None) is not None

    @torch.inference_mode()
    def __call__(self, input_ids: torch.Tensor, positions: torch.Tensor,
                 kv_caches: list[tuple[torch.Tensor, torch.Tensor]], meta: cpu_decode.CpuDecodeMetadata,
                 hidden_in: Optional[torch.Tensor] = None) -> torch.Tensor:
        """The stage's output, as ``CausalLM.forward`` returns it, for a step ``applies`` admits."""
        x = F.embedding(input_ids, self.embed) if self.embed is not None else hidden_in
        x = x.contiguous()
        t, hidden, d = x.shape[0], self.hidden, self.head_dim
        heads, kvh = self.heads, self.kv_heads
        plan, slots = meta.decode, meta.slot_mapping
        if (x.dtype != torch.bfloat16 or x.dim() != 2 or x.shape[1] != hidden or slots.shape != (t,)
                or plan.group.token_end - plan.group.token_start != t or not slots.is_contiguous()):
            raise ValueError(f"DecodeFastPath: a decode-only step of bf16 rows [{t}, {hidden}], one slot and one "
                             f"sequence per token")
        threads = torch.get_num_threads()
        ew, at = self.ew, self.attn
        cos, sin = self.cos[positions], self.sin[positions]  # [T, D], one row per token
        cos_p, sin_p = cos.data_ptr(), sin.data_ptr()
        cos3, sin3 = cos.view(t, 1, d), sin.view(t, 1, d)
        # per-step buffers, reused by every layer (each is consumed before the next layer writes it)
        normed, residual = torch.empty(t, hidden, dtype=torch.bfloat16), torch.empty(t, hidden, dtype=torch.bfloat16)
        qk = torch.empty(t, heads + kvh, d, dtype=torch.bfloat16)
        att = torch.empty(t, heads * d, dtype=torch.bfloat16)
        act = torch.empty(t, self.intermediate, dtype=torch.bfloat16)
        normed_p, res_p, qk_p, att_p, act_p = (b.data_ptr() for b in (normed, residual, qk, att, act))
        tables, lens = plan.block_tables, plan.seq_lens
        tables_p, tables_w, lens_p, slots_p = tables.data_ptr(), tables.shape[1], lens.data_ptr(), slots.data_ptr()
        qk_stride, q_end = (heads + kvh) * d, self.q_size + self.kv_size
        delta_p = None  # the previous sublayer's output, added into the residual by the next norm
        stream_p = x.data_ptr()  # the residual stream: x itself until the first add writes `residual`
        for lp, (k_cache, v_cache) in zip(self.layers, kv_caches):
            _, nb, bs, _ = k_cache.shape
            if delta_p is None:
                call("actorserve::rms_norm_bf16", ew.rms_norm_bf16, stream_p, None, None, lp.in_norm, normed_p,
                     t, hidden, lp.eps_in, threads)
            else:
                call("actorserve::add_rms_norm_bf16", ew.rms_norm_bf16, stream_p, delta_p, res_p, lp.in_norm,
                     normed_p, t, hidden, lp.eps_in, threads)
                stream_p = res_p
            qkv = lp.qkv(normed)
            qkv_p, qkv_stride = qkv.data_ptr(), qkv.stride(0)
            if lp.q_norm is None:  # q and k are adjacent columns: rotate them together, as the module path
                call("actorserve::rotary_bf16", ew.rotary_bf16, qkv_p, qkv_stride, cos_p, sin_p, qk_p, t,
                     heads + kvh, d, threads)
                q_p, q_stride, k_p, k_stride = qk_p, qk_stride, qk_p + heads * d * 2, qk_stride
            else:
                q = rotary(lp.q_norm.forward(qkv[:, :self.q_size].reshape(t, heads, d)), (cos3, sin3))
                k = rotary(lp.k_norm.forward(qkv[:, self.q_size:q_end].reshape(t, kvh, d)), (cos3, sin3))
                q_p, q_stride, k_p, k_stride = q.data_ptr(), heads * d, k.data_ptr(), kvh * d
            rc = call("actorserve::write_kv_bf16", at.write_kv_bf16, k_p, k_stride, qkv_p + q_end * 2, qkv_stride,
                      slots_p, t, kvh, d, k_cache.data_ptr(), v_cache.data_ptr(), nb * bs)
            if rc != 0:
                raise IndexError("write_kv: a slot is outside the KV cache")
            rc = call(cpu_decode.PROFILE_NAME, at.paged_decode_bf16, q_p, q_stride, k_cache.data_ptr(),
                      v_cache.data_ptr(), tables_p, tables_w, lens_p, att_p, t, heads, kvh, nb, bs, d, self.scale,
                      threads)
            if rc != 0:
                raise RuntimeError(f"paged_decode_bf16 failed ({rc}): shapes outside the kernel, or out of memory")
            o = lp.o(att)
            call("actorserve::add_rms_norm_bf16", ew.rms_norm_bf16, stream_p, o.data_ptr(), res_p, lp.post_norm,
                 normed_p, t, hidden, lp.eps_post, threads)
            stream_p = res_p
            if lp.gate_up is None:
                out = lp.mlp(normed)
            else:
                gate_up = lp.gate_up(normed)
                call("actorserve::silu_mul_bf16", ew.silu_mul_bf16, gate_up.data_ptr(), act_p, t, self.intermediate,
                     threads)
                out = lp.down(act)
            delta_p = out.data_ptr()
            delta = out  # held until the next norm has read it
        if self.final_norm is not None:
            final = torch.empty(t, hidden, dtype=torch.bfloat16)
            call("actorserve::add_rms_norm_bf16", ew.rms_norm_bf16, stream_p, delta_p, res_p,
                 self.final_norm.weight.data_ptr(), final.data_ptr(), t, hidden, self.final_norm.eps, threads)
            return final
        return residual + delta


__all__ = ["DecodeFastPath"]

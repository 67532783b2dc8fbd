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
(prepacked bf16 or int8). Where every product of every layer is int8 (``--quantization int8``), the
layers run as ``_int8_layers``: the pass between two products (dequantize, residual add + RMSNorm,
quantize) is one C call, so the norms' bf16 rows are never written.
"""
from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Callable, Optional

import torch
from torch.nn import functional as F

from actorserve.kernels.attention import cpu_decode
from actorserve.kernels.elementwise import cpu_bf16, rotary
from actorserve.kernels.gemm import Int8Weight, PackedWeight, int8
from actorserve.kernels.profiling import call
from actorserve.runtime.model.decoder import CausalLM, DecoderLayer
from actorserve.runtime.model.layers import Linear

Product = Callable[[torch.Tensor], torch.Tensor]


def _product(linear: Linear) -> Product:
    """The linear's product as one call on 2-D rows, straight to oneDNN where the weight is prepacked
    (``packed_linear`` less its checks and reshapes: the rows here are the plan's own contiguous bf16);
    any other weight through its module. (Int8 models take ``_int8_layers``.)"""
    packed, bias = linear.packed, linear.bias
    if isinstance(packed, PackedWeight):
        op, tensor = torch.ops.mkldnn._linear_pointwise.default, packed.tensor
        return lambda rows: op(rows, tensor, bias, "none", [], "")
    return linear.forward


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


@dataclass
class _Int8Layer:
    """A layer's int8 weights (``Int8Weight.q_t`` and per-channel scales) for ``_int8_layers``."""

    qkv_t: torch.Tensor
    qkv_scales: torch.Tensor
    qkv_bias_t: Optional[torch.Tensor]
    o_t: torch.Tensor
    o_scales: torch.Tensor
    gate_up_t: torch.Tensor
    gate_up_scales: torch.Tensor
    down_t: torch.Tensor
    down_scales: torch.Tensor

    def __post_init__(self) -> None:  # the kernels' pointers, taken once
        self.qkv_scale, self.o_scale = self.qkv_scales.data_ptr(), self.o_scales.data_ptr()
        self.gate_up_scale, self.down_scale = self.gate_up_scales.data_ptr(), self.down_scales.data_ptr()
        self.qkv_bias = None if self.qkv_bias_t is None else self.qkv_bias_t.data_ptr()


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
        self.int8_lib = int8.library()
        usable = self.int8_lib is not None and int8.int_mm_available()  # its products are torch._int_mm
        self.int8_layers = self._int8_weights(model) if usable else None

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
        return _LayerPlan(
            in_norm=layer.input_layernorm.weight.data_ptr(), post_norm=layer.post_attention_layernorm.weight.data_ptr(),
            eps_in=layer.input_layernorm.eps, eps_post=layer.post_attention_layernorm.eps,
            qkv=_product(attn.qkv_proj), o=_product(attn.o_proj),
            gate_up=None if fused_int8 else _product(mlp.gate_up_proj),
            down=None if fused_int8 else _product(mlp.down_proj), mlp=mlp.forward,
            q_norm=attn.q_norm, k_norm=attn.k_norm)

    @staticmethod
    def _int8_weights(model: CausalLM) -> Optional[list["_Int8Layer"]]:
        """Every layer's four int8 weights, or None unless all of them are int8 (o, gate_up and down
        without bias, as the decoder builds them)."""
        layers = []
        for layer in model.model.layers.values():
            attn, mlp = layer.self_attn, layer.mlp
            linears = (attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj)
            if not all(isinstance(m.packed, Int8Weight) for m in linears) or any(
                    m.bias is not None for m in linears[1:]) or (
                    attn.qkv_proj.bias is not None and attn.qkv_proj.bias.dtype != torch.bfloat16):
                return None
            qkv, o, gu, down = (m.packed for m in linears)
            bias = attn.qkv_proj.bias
            layers.append(_Int8Layer(qkv.q_t, qkv.scale, None if bias is None else bias.contiguous(), o.q_t, o.scale,
                                     gu.q_t, gu.scale, down.q_t, down.scale))
        return layers

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
        t, hidden = x.shape[0], self.hidden
        plan, slots = meta.decode, meta.slot_mapping
        if (x.dtype != torch.bfloat16 or x.dim() != 2 or x.shape[1] != hidden or slots.shape != (t,)
                or plan.group.token_end - plan.group.token_start != t or not slots.is_contiguous()):
            raise ValueError(f"DecodeFastPath: a decode-only step of bf16 rows [{t}, {hidden}], one slot and one "
                             f"sequence per token")
        step = _Step(self, t, positions, plan, slots)
        residual = torch.empty(t, hidden, dtype=torch.bfloat16)  # the stream once the first add has written it
        if self.int8_layers is not None:
            delta = self._int8_layers(x, residual, kv_caches, step)
        else:
            delta = self._layers(x, residual, kv_caches, step)
        if self.final_norm is not None:
            final = torch.empty(t, hidden, dtype=torch.bfloat16)
            call("actorserve::add_rms_norm_bf16", self.ew.rms_norm_bf16, residual.data_ptr(), delta.data_ptr(),
                 residual.data_ptr(), self.final_norm.weight.data_ptr(), final.data_ptr(), t, hidden,
                 self.final_norm.eps, step.threads)
            return final
        return residual + delta

    def _layers(self, x: torch.Tensor, residual: torch.Tensor, kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
                step: "_Step") -> torch.Tensor:
        """Every layer, on whatever products the layers hold; returns the last MLP's output (the residual
        stream is then ``residual + it``)."""
        ew, t, hidden, threads = self.ew, step.t, self.hidden, step.threads
        normed = torch.empty(t, hidden, dtype=torch.bfloat16)
        act = torch.empty(t, self.intermediate, dtype=torch.bfloat16)
        normed_p, res_p, act_p = normed.data_ptr(), residual.data_ptr(), act.data_ptr()
        delta = None  # the previous sublayer's output, added into the residual by the next norm
        stream_p = x.data_ptr()  # the residual stream: x itself until the first add writes `residual`
        for lp, (k_cache, v_cache) in zip(self.layers, kv_caches):
            if delta is None:
                call("actorserve::rms_norm_bf16", ew.rms_norm_bf16, stream_p, None, None, lp.in_norm, normed_p,
                     t, hidden, lp.eps_in, threads)
            else:
                call("actorserve::add_rms_norm_bf16", ew.rms_norm_bf16, stream_p, delta.data_ptr(), res_p,
                     lp.in_norm, normed_p, t, hidden, lp.eps_in, threads)
                stream_p = res_p
            self._attend(lp, lp.qkv(normed), k_cache, v_cache, step)
            o = lp.o(step.att)
            call("actorserve::add_rms_norm_bf16", ew.rms_norm_bf16, stream_p, o.data_ptr(), res_p, lp.post_norm,
                 normed_p, t, hidden, lp.eps_post, threads)
            stream_p = res_p
            if lp.gate_up is None:
                delta = lp.mlp(normed)
            else:
                gate_up = lp.gate_up(normed)
                call("actorserve::silu_mul_bf16", ew.silu_mul_bf16, gate_up.data_ptr(), act_p, t, self.intermediate,
                     threads)
                delta = lp.down(act)
        return delta

    def _int8_layers(self, x: torch.Tensor, residual: torch.Tensor,
                     kv_caches: list[tuple[torch.Tensor, torch.Tensor]], step: "_Step") -> torch.Tensor:
        """Every layer with all four products int8: each product's result goes through the seam pass
        (``int8.dequant_add_norm_quantize``) straight to the next product's int8 rows, so the norms' bf16
        outputs are never written; the same operations as ``_layers``, in fewer calls."""
        ew, lib, t, hidden, threads = self.ew, self.int8_lib, step.t, self.hidden, step.threads
        inter, q_size = self.intermediate, self.q_size
        i8, i32, f32, b16 = torch.int8, torch.int32, torch.float32, torch.bfloat16
        q_h, s_h = torch.empty(t, hidden, dtype=i8), torch.empty(t, dtype=f32)  # the norms' rows, quantized
        q_a, s_a = torch.empty(t, q_size, dtype=i8), torch.empty(t, dtype=f32)  # attention's, for o_proj
        q_i, s_i = torch.empty(t, inter, dtype=i8), torch.empty(t, dtype=f32)  # the MLP middle's, for down
        acc_qkv = torch.empty(t, q_size + 2 * self.kv_size, dtype=i32)
        qkv = torch.empty(t, q_size + 2 * self.kv_size, dtype=b16)
        acc_o, acc_gu, acc_d = (torch.empty(t, n, dtype=i32) for n in (hidden, 2 * inter, hidden))
        q_h_p, s_h_p, q_a_p, s_a_p, q_i_p, s_i_p = (b.data_ptr() for b in (q_h, s_h, q_a, s_a, q_i, s_i))
        acc_qkv_p, acc_o_p, acc_gu_p, acc_d_p = (b.data_ptr() for b in (acc_qkv, acc_o, acc_gu, acc_d))
        qkv_p, res_p, att_p = qkv.data_ptr(), residual.data_ptr(), step.att.data_ptr()
        stream_p = x.data_ptr()
        previous = None  # the previous layer's plan, whose down product this layer's first seam finishes
        for lp, w, (k_cache, v_cache) in zip(self.layers, self.int8_layers, kv_caches):
            if previous is None:
                normed = torch.empty(t, hidden, dtype=b16)
                call("actorserve::rms_norm_bf16", ew.rms_norm_bf16, stream_p, None, None, lp.in_norm,
                     normed.data_ptr(), t, hidden, lp.eps_in, threads)
                call("actorserve::quantize_rows_bf16", lib.quantize_rows_bf16, normed.data_ptr(), q_h_p, s_h_p, t,
                     hidden, threads)
            else:
                self._seam(acc_d_p, s_i_p, previous.down_scale, None, stream_p, res_p, lp.in_norm, lp.eps_in,
                           q_h_p, s_h_p, step)
                stream_p = res_p
            torch._int_mm(q_h, w.qkv_t, out=acc_qkv)
            call("actorserve::dequant_rows_bf16", lib.dequant_rows_bf16, acc_qkv_p, s_h_p, w.qkv_scale, w.qkv_bias,
                 qkv_p, t, qkv.shape[1], threads)
            self._attend(lp, qkv, k_cache, v_cache, step)
            call("actorserve::quantize_rows_bf16", lib.quantize_rows_bf16, att_p, q_a_p, s_a_p, t, q_size, threads)
            torch._int_mm(q_a, w.o_t, out=acc_o)
            self._seam(acc_o_p, s_a_p, w.o_scale, None, stream_p, res_p, lp.post_norm, lp.eps_post, q_h_p, s_h_p,
                       step)
            stream_p = res_p
            torch._int_mm(q_h, w.gate_up_t, out=acc_gu)
            rc = call("actorserve::silu_mul_quantize_rows", lib.silu_mul_quantize_rows, acc_gu_p, s_h_p,
                      w.gate_up_scale, q_i_p, s_i_p, t, inter, threads)
            if rc != 0:
                raise MemoryError("silu_mul_quantize_rows: no memory for a row buffer")
            torch._int_mm(q_i, w.down_t, out=acc_d)
            previous = w
        delta = torch.empty(t, hidden, dtype=b16)
        call("actorserve::dequant_rows_bf16", lib.dequant_rows_bf16, acc_d_p, s_i_p, previous.down_scale, None,
             delta.data_ptr(), t, hidden, threads)
        return delta

    def _seam(self, acc_p: int, sx_p: int, sw_p: int, bias_p: Optional[int], res_in_p: int, res_out_p: int,
              norm_p: int, eps: float, q_p: int, s_p: int, step: "_Step") -> None:
        rc = call("actorserve::dequant_add_norm_quantize_rows", self.int8_lib.dequant_add_norm_quantize_rows, acc_p,
                  sx_p, sw_p, bias_p, res_in_p, res_out_p, norm_p, eps, q_p, s_p, step.t, self.hidden, step.threads)
        if rc != 0:
            raise MemoryError("dequant_add_norm_quantize_rows: no memory for a row buffer")

    def _attend(self, lp: _LayerPlan, qkv: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                step: "_Step") -> None:
        """Rotary on q and k, the new k and v into the cache, and decode attention into ``step.att``."""
        ew, at, t, d, threads = self.ew, self.attn, step.t, self.head_dim, step.threads
        heads, kvh, q_end = self.heads, self.kv_heads, self.q_size + self.kv_size
        _, nb, bs, _ = k_cache.shape
        qkv_p, qkv_stride = qkv.data_ptr(), qkv.stride(0)
        if lp.q_norm is None:  # q and k are adjacent columns: rotate them together, as the module path
            call("actorserve::rotary_bf16", ew.rotary_bf16, qkv_p, qkv_stride, step.cos_p, step.sin_p, step.qk_p, t,
                 heads + kvh, d, threads)
            qk_stride = (heads + kvh) * d
            q_p, q_stride, k_p, k_stride = step.qk_p, qk_stride, step.qk_p + heads * d * 2, qk_stride
        else:
            q = rotary(lp.q_norm.forward(qkv[:, :self.q_size].reshape(t, heads, d)), step.rope)
            k = rotary(lp.k_norm.forward(qkv[:, self.q_size:q_end].reshape(t, kvh, d)), step.rope)
            q_p, q_stride, k_p, k_stride = q.data_ptr(), heads * d, k.data_ptr(), kvh * d
        rc = call("actorserve::write_kv_bf16", at.write_kv_bf16, k_p, k_stride, qkv_p + q_end * 2, qkv_stride,
                  step.slots_p, t, kvh, d, k_cache.data_ptr(), v_cache.data_ptr(), nb * bs)
        if rc != 0:
            raise IndexError("write_kv: a slot is outside the KV cache")
        rc = call(cpu_decode.PROFILE_NAME, at.paged_decode_bf16, q_p, q_stride, k_cache.data_ptr(), v_cache.data_ptr(),
                  step.tables_p, step.tables_w, None, step.lens_p, step.att_p, t, heads, kvh, nb, bs, d, self.scale, threads)
        if rc != 0:
            raise RuntimeError(f"paged_decode_bf16 failed ({rc}): shapes outside the kernel, or out of memory")


class _Step:
    """What every layer of one step reads: the rotary rows, the attention plan's pointers, and the
    attention buffers (each layer's are consumed before the next layer writes them)."""

    def __init__(self, path: DecodeFastPath, t: int, positions: torch.Tensor, plan: cpu_decode.KernelDecodePlan,
                 slots: torch.Tensor) -> None:
        d = path.head_dim
        self.t, self.threads = t, torch.get_num_threads()
        self.cos, self.sin = path.cos[positions], path.sin[positions]  # [T, D], one row per token
        self.cos_p, self.sin_p = self.cos.data_ptr(), self.sin.data_ptr()
        self.rope = (self.cos.view(t, 1, d), self.sin.view(t, 1, d))
        self.qk = torch.empty(t, path.heads + path.kv_heads, d, dtype=torch.bfloat16)
        self.att = torch.empty(t, path.heads * d, dtype=torch.bfloat16)
        self.qk_p, self.att_p = self.qk.data_ptr(), self.att.data_ptr()
        self.tables, self.lens, self.slots = plan.block_tables, plan.seq_lens, slots
        self.tables_p, self.tables_w = self.tables.data_ptr(), self.tables.shape[1]
        self.lens_p, self.slots_p = self.lens.data_ptr(), slots.data_ptr()


__all__ = ["DecodeFastPath"]

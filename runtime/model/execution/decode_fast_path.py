"""A decode-only step of a bf16 or fp32 model on the CPU kernels, with its dispatch resolved once at load.

At batch 1 much of a decode step went to Python between kernels: some 240 module calls, a gate per
kernel call (bf16? on the CPU? without grad?), wrappers that reshape their inputs and re-derive strides,
and 300 small allocations. None of that changes between the steps of a loaded model, so it is decided
once.

The plan is derived from the modules, not written beside them: each module of the model has a
``decode_plan`` next to its ``forward``, which hands a ``DecodePlanner`` its own parts in its own order
(the decoder layer its norms, attention and MLP; the attention its products, q/k norms and cache; each
linear its weight's ``rows_product``). The planner turns them into a flat list of kernel calls on
pointers into a few buffers allocated per step, choosing once at load how each value passes from one call
to the next. An int8 product hands on its int32 result, so the pass after it (dequantize, residual add +
RMSNorm, quantize for the next int8 product) is one C call and the norm's bf16 rows are never written;
any other product hands on rows of the model's dtype. A new weight kind, kernel or ISA then changes its own module or
weight kind, and a model switch (a bias, q/k norms, a tied head) lives in the module that has it.

It computes what the module path (``CausalLM.forward``) computes, with the same kernels on the same
operands in the same order, so its hidden states are the module path's bit for bit (tested). It serves
only the steps the module path would send to those kernels: every scheduled chunk a decode, a bf16 or
fp32 model whose attention is ``CpuDecodeBackend``'s and whose row operations are ``fused_rows.c``'s.
Values pass between calls in the model's dtype ("rows"); an fp32 model's products are its GGUF blocks'
(``GgufWeight``) or its dense weights'. Prefill and mixed steps and other devices take the module path.
"""
from __future__ import annotations

import ctypes
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Optional, Union

import torch
from torch.nn import functional as F

from actorserve.kernels.attention import cpu_decode
from actorserve.kernels.elementwise import cpu_rows, rotary
from actorserve.kernels.gemm import int8
from actorserve.kernels.gemm.rows_product import INT8, ROWS, RowsProduct
from actorserve.kernels.profiling import call

if TYPE_CHECKING:
    from actorserve.runtime.model.architectures.decoder import Attention, CausalLM
    from actorserve.runtime.model.architectures.layers import Embedding, Linear, RMSNorm

Op = Callable[["DecodeStep"], None]


@dataclass(frozen=True)
class Rows:
    """Rows [T, width] of the model's dtype in slot ``slot`` of the step."""

    slot: int
    width: int


@dataclass(frozen=True)
class QuantizedRows:
    """int8 rows [T, width] and their fp32 scales [T] (``int8.quantize_rows``)."""

    q: int
    s: int
    width: int


@dataclass(frozen=True)
class Accumulator:
    """An int8 product's int32 result [T, width], to be scaled by the rows' scales (slot ``s``), the weight's
    per-channel scales and its bias (pointers; the weight owns them)."""

    acc: int
    s: int
    width: int
    scale_p: int
    bias_p: Optional[int]


Value = Union[Rows, QuantizedRows, Accumulator]
_FILLED = None  # a slot's shape where an op stores the tensor it returns (oneDNN's products allocate)


class DecodePlanner:
    """What the modules' ``decode_plan`` methods build a step with: slots (buffers, allocated per step and
    shared by every layer, since each layer's values are consumed before the next layer writes them), and
    the ops in order. Each method plans one operation on values and returns the value it makes."""

    def __init__(self, hidden: int, dtype: torch.dtype, elementwise: ctypes.CDLL, attention: ctypes.CDLL,
                 int8_lib: Optional[ctypes.CDLL]) -> None:
        """``elementwise`` and ``attention`` are the libraries built for ``dtype``; ``int8_lib`` the int8
        row passes (bf16 only), or None."""
        self.hidden, self.dtype, self.ew, self.attn, self.int8_lib = hidden, dtype, elementwise, attention, int8_lib
        self.elem = torch.empty((), dtype=dtype).element_size()
        self.ops: list[Op] = []
        self.kernels: Counter = Counter()  # what the plan calls, by name, for its description and tests
        self.shapes: list[Optional[tuple[Optional[int], torch.dtype]]] = []
        self._slots: dict[tuple, int] = {}
        self._products: dict[int, RowsProduct] = {}  # by id(linear), while planning
        self.layers = 0  # attention layers planned so far: the next one's KV cache
        self.embed: Optional[Callable[[torch.Tensor], torch.Tensor]] = None
        self.output: Optional[int] = None  # the slot of the stage's output

    # -- slots and ops -------------------------------------------------------------------------------
    def slot(self, name: str, width: Optional[int], dtype: torch.dtype) -> int:
        """A buffer [T, width] (width None: [T]), the same one wherever the same name, width and dtype ask."""
        key = (name, width, dtype)
        if key not in self._slots:
            self._slots[key] = len(self.shapes)
            self.shapes.append((width, dtype))
        return self._slots[key]

    def filled(self, name: str) -> int:
        key = (name, _FILLED)
        if key not in self._slots:
            self._slots[key] = len(self.shapes)
            self.shapes.append(_FILLED)
        return self._slots[key]

    def emit(self, kernel: str, op: Op) -> None:
        self.ops.append(op)
        self.kernels[kernel] += 1

    def _rows(self, name: str, width: int) -> Rows:
        return Rows(self.slot(name, width, self.dtype), width)

    def _quantized(self, name: str, width: int) -> QuantizedRows:
        return QuantizedRows(self.slot(name + ".q", width, torch.int8), self.slot(name + ".s", None, torch.float32),
                             width)

    # -- products and the passes between them ----------------------------------------------------------
    def product_of(self, linear: "Linear") -> RowsProduct:
        key = id(linear)
        if key not in self._products:
            self._products[key] = linear.rows_product(self.dtype)
        return self._products[key]

    def takes(self, linear: "Linear") -> str:
        """The form of the rows this linear multiplies (``rows_product``): what the pass before it writes."""
        return self.product_of(linear).takes

    def product(self, linear: "Linear", x: Value, name: str) -> Value:
        p = self.product_of(linear)
        x = self.convert(x, p.takes, name + ".in")
        if p.takes == ROWS and p.into is not None:  # into a slot of the step: nothing allocated
            out, src, into, most, run = self.slot(name, p.out_features, self.dtype), x.slot, p.into, p.into_rows, p.run

            def op_into(st: DecodeStep) -> None:
                if st.t <= most:
                    into(st.ptrs[src], st.ptrs[out], st.t, st.threads)
                else:
                    st.bufs[out].copy_(run(st.bufs[src]))
            self.emit("product_rows", op_into)
            return Rows(out, p.out_features)
        if p.takes == ROWS:
            out, src, run = self.filled(name), x.slot, p.run

            def op(st: DecodeStep) -> None:
                r = run(st.bufs[src])
                st.bufs[out], st.ptrs[out] = r, r.data_ptr()
            self.emit("product_rows", op)
            return Rows(out, p.out_features)
        if p.takes != INT8:
            raise ValueError(f"decode plan: a product that takes {p.takes!r} rows")
        acc, q, run = self.slot(name + ".acc", p.out_features, torch.int32), x.q, p.run
        self.emit("product_int8", lambda st: run(st.bufs[q], st.bufs[acc]))
        return Accumulator(acc, x.s, p.out_features, p.scale.data_ptr(),
                           None if p.bias is None else p.bias.data_ptr())

    def convert(self, x: Value, form: str, name: str) -> Value:
        """x in the form a consumer takes: rows of the model's dtype, or int8 rows with scales."""
        if isinstance(x, Accumulator):
            x = self._dequantize(x, name)
        if isinstance(x, Rows) and form == INT8:
            return self._quantize(x, name)
        if (isinstance(x, Rows) and form == ROWS) or (isinstance(x, QuantizedRows) and form == INT8):
            return x
        raise ValueError(f"decode plan: no pass from {type(x).__name__} to {form} rows")

    def _dequantize(self, a: Accumulator, name: str) -> Rows:
        lib, out = self.int8_lib, self._rows(name, a.width)

        def op(st: DecodeStep) -> None:
            call("actorserve::dequant_rows_bf16", lib.dequant_rows_bf16, st.ptrs[a.acc], st.ptrs[a.s], a.scale_p,
                 a.bias_p, st.ptrs[out.slot], st.t, a.width, st.threads)
        self.emit("dequant_rows_bf16", op)
        return out

    def _quantize(self, x: Rows, name: str) -> QuantizedRows:
        lib, out = self.int8_lib, self._quantized(name, x.width)

        def op(st: DecodeStep) -> None:
            call("actorserve::quantize_rows_bf16", lib.quantize_rows_bf16, st.ptrs[x.slot], st.ptrs[out.q],
                 st.ptrs[out.s], st.t, x.width, st.threads)
        self.emit("quantize_rows_bf16", op)
        return out

    # -- row operations --------------------------------------------------------------------------------
    def add_rms_norm(self, norm: "RMSNorm", delta: Optional[Value], form: str, name: str) -> Value:
        """The residual stream plus ``delta`` (the previous sublayer's output; None at a stage's first
        norm, where the stream is its input) written back as the stream, and its RMSNorm in ``form``."""
        ew, hidden, w_p, eps = self.ew, self.hidden, norm.weight.data_ptr(), norm.eps
        res = self.slot("residual", hidden, self.dtype)
        if isinstance(delta, Accumulator) and form == INT8 and self.int8_lib is not None:
            lib, out = self.int8_lib, self._quantized(name, hidden)

            def seam(st: DecodeStep) -> None:
                rc = call("actorserve::dequant_add_norm_quantize_rows", lib.dequant_add_norm_quantize_rows,
                          st.ptrs[delta.acc], st.ptrs[delta.s], delta.scale_p, delta.bias_p, st.stream_p,
                          st.ptrs[res], w_p, eps, st.ptrs[out.q], st.ptrs[out.s], st.t, hidden, st.threads)
                if rc != 0:
                    raise MemoryError("dequant_add_norm_quantize_rows: no memory for a row buffer")
                st.stream_p = st.ptrs[res]
            self.emit("dequant_add_norm_quantize_rows", seam)
            return out
        normed = self._rows(name, hidden)
        if delta is None:
            label = cpu_rows.profile_name("rms_norm", self.dtype)
            self.emit("rms_norm", lambda st: call(
                label, ew.rms_norm, st.stream_p, None, None, w_p, st.ptrs[normed.slot],
                st.t, hidden, eps, st.threads))
        else:
            d, label = self.convert(delta, ROWS, name + ".delta"), cpu_rows.profile_name("add_rms_norm", self.dtype)

            def add_norm(st: DecodeStep) -> None:
                call(label, ew.rms_norm, st.stream_p, st.ptrs[d.slot], st.ptrs[res],
                     w_p, st.ptrs[normed.slot], st.t, hidden, eps, st.threads)
                st.stream_p = st.ptrs[res]
            self.emit("add_rms_norm", add_norm)
        return self.convert(normed, form, name)

    def silu_mul(self, gate_up: Value, form: str, name: str) -> Value:
        """SiLU(gate) * up of the gate and up halves, in ``form``."""
        inter = gate_up.width // 2
        if (isinstance(gate_up, Accumulator) and gate_up.bias_p is None and form == INT8
                and self.int8_lib is not None):
            lib, out = self.int8_lib, self._quantized(name, inter)

            def op(st: DecodeStep) -> None:
                rc = call("actorserve::silu_mul_quantize_rows", lib.silu_mul_quantize_rows, st.ptrs[gate_up.acc],
                          st.ptrs[gate_up.s], gate_up.scale_p, st.ptrs[out.q], st.ptrs[out.s], st.t, inter,
                          st.threads)
                if rc != 0:
                    raise MemoryError("silu_mul_quantize_rows: no memory for a row buffer")
            self.emit("silu_mul_quantize_rows", op)
            return out
        ew, gu, act = self.ew, self.convert(gate_up, ROWS, name + ".gate_up"), self._rows(name, inter)
        label = cpu_rows.profile_name("silu_mul", self.dtype)
        self.emit("silu_mul", lambda st: call(
            label, ew.silu_mul, st.ptrs[gu.slot], st.ptrs[act.slot], st.t, inter,
            st.threads))
        return self.convert(act, form, name)

    def attend(self, attn: "Attention", qkv: Value) -> Rows:
        """Rotary on q and k (after the q/k norms where the attention has them), the new k and v into this
        layer's KV cache, and decode attention over the cache."""
        qkv = self.convert(qkv, ROWS, "qkv.rows")
        at, ew, layer, e = self.attn, self.ew, self.layers, self.elem
        rotary_label = cpu_rows.profile_name("rotary", self.dtype)
        self.layers += 1
        heads, kvh, d, scale = attn.num_heads, attn.num_kv_heads, attn.head_dim, attn.scale
        window, softcap = attn.window, attn.softcap
        q_size, q_end = attn.q_size, attn.q_size + attn.kv_size
        q_norm, k_norm = attn.q_norm, attn.k_norm
        out = self._rows("att", heads * d)
        qk = self.slot("qk", (heads + kvh) * d, self.dtype)

        def op(st: DecodeStep) -> None:
            t, threads, k_cache, v_cache = st.t, st.threads, *st.kv_caches[layer]
            _, nb, bs, _ = k_cache.shape
            x = st.bufs[qkv.slot]
            qkv_p, qkv_stride = st.ptrs[qkv.slot], x.stride(0)
            if q_norm is None:  # q and k are adjacent columns: rotate them together, as the module path
                call(rotary_label, ew.rotary, qkv_p, qkv_stride, st.cos_p, st.sin_p, st.ptrs[qk],
                     t, heads + kvh, d, threads)
                q_p = k_p = st.ptrs[qk]
                k_p += heads * d * e
                q_stride = k_stride = (heads + kvh) * d
            else:
                q = rotary(q_norm.forward(x[:, :q_size].reshape(t, heads, d)), st.rope)
                k = rotary(k_norm.forward(x[:, q_size:q_end].reshape(t, kvh, d)), st.rope)
                q_p, q_stride, k_p, k_stride = q.data_ptr(), heads * d, k.data_ptr(), kvh * d
            rc = call("actorserve::write_kv", at.write_kv, k_p, k_stride, qkv_p + q_end * e, qkv_stride,
                      st.slots_p, t, kvh, d, k_cache.data_ptr(), v_cache.data_ptr(), nb * bs)
            if rc != 0:
                raise IndexError("write_kv: a slot is outside the KV cache")
            rc = call(cpu_decode.PROFILE_NAME, at.paged_decode, q_p, q_stride, k_cache.data_ptr(),
                      v_cache.data_ptr(), st.tables_p, st.tables_w, None, st.lens_p, st.ptrs[out.slot], t, heads, kvh,
                      nb, bs, d, scale, window, softcap, threads)
            if rc != 0:
                raise RuntimeError(f"paged_decode failed ({rc}): shapes outside the kernel, or out of memory")
        self.emit("attention", op)
        return out

    # -- the ends of a stage ---------------------------------------------------------------------------
    def embedding(self, embed: Optional["Embedding"]) -> None:
        """The first stage's token lookup (a later stage starts from the hidden states it is handed)."""
        if embed is None:
            return
        weight = embed.weight
        self.embed = (lambda ids: F.embedding(ids, weight)) if weight is not None else embed.forward

    def final_norm(self, norm: "RMSNorm", delta: Value) -> None:
        """The last stage's output: the normalised residual stream."""
        rows = self.add_rms_norm(norm, delta, ROWS, "final")
        self.output = rows.slot

    def residual_out(self, delta: Value) -> None:
        """A stage before the last hands on the residual stream itself."""
        d, res, out = self.convert(delta, ROWS, "delta"), self.slot("residual", self.hidden, self.dtype), \
            self.filled("stream")

        def op(st: DecodeStep) -> None:
            r = st.bufs[res] + st.bufs[d.slot]
            st.bufs[out], st.ptrs[out] = r, r.data_ptr()
        self.emit("add", op)
        self.output = out


class DecodeFastPath:
    """Built by ``build`` where every gate of the path holds; ``applies`` is checked each step."""

    def __init__(self, model: "CausalLM", planner: DecodePlanner) -> None:
        if planner.output is None or planner.layers == 0:
            raise ValueError("DecodeFastPath: the model planned no output")
        self.hidden, self.planner, self.ops = model.cfg.hidden_size, planner, list(planner.ops)
        # the module path casts the fp32 tables' rows each step; cast once, the values are the same
        self.dtype = planner.dtype
        self.cos = model.rotary.cos.to(self.dtype)
        self.sin = model.rotary.sin_signed.to(self.dtype)

    @property
    def kernels(self) -> Counter:
        """How many times a step calls each operation, by name."""
        return self.planner.kernels

    @classmethod
    def build(cls, model: "CausalLM", backend: object,
              kv_dtype: Optional[torch.dtype] = None) -> Optional["DecodeFastPath"]:
        """The path for this model and backend over KV caches of ``kv_dtype`` (default: the model's dtype), or
        None where a gate fails (the module path serves all)."""
        dtype = model.dtype
        ew, attn = cpu_rows.library(dtype), cpu_decode.library(dtype, kv_dtype)
        if (ew is None or attn is None or not isinstance(backend, cpu_decode.CpuDecodeBackend)
                or next(model.parameters()).device.type != "cpu"
                or model.rotary is None or model.num_local_layers == 0 or not hasattr(model, "decode_plan")
                # (sparse MLPs, whole-projection q/k norms and Gemma's layers have no decode plan yet: the
                # module path serves them)
                or model.cfg.sparse_layers or model.cfg.qk_norm_whole or model.cfg.sandwich_norms
                or model.cfg.hidden_act != "silu" or model.cfg.embed_scale or model.rotary_local is not None
                or model.cfg.linear_layers or model.cfg.attn_output_gate or model.cfg.rotary_dim or model.cfg.mla):
            return None
        planner = DecodePlanner(model.cfg.hidden_size, dtype, ew, attn,
                                int8.library() if dtype == torch.bfloat16 else None)
        model.decode_plan(planner)
        return cls(model, planner)

    @staticmethod
    def applies(meta: object) -> bool:
        """Whether this step is one the path serves: decodes only (``CpuDecodeBackend.prepare``'s plan)."""
        return getattr(meta, "prefill", True) is None and getattr(meta, "decode", None) is not None

    @torch.inference_mode()
    def __call__(self, input_ids: torch.Tensor, positions: torch.Tensor,
                 kv_caches: list[tuple[torch.Tensor, torch.Tensor]], meta: cpu_decode.CpuDecodeMetadata,
                 hidden_in: Optional[torch.Tensor] = None) -> torch.Tensor:
        """The stage's output, as ``CausalLM.forward`` returns it, for a step ``applies`` admits."""
        embed = self.planner.embed
        x = (embed(input_ids) if embed is not None else hidden_in).contiguous()
        t, hidden = x.shape[0], self.hidden
        plan, slots = meta.decode, meta.slot_mapping
        if (x.dtype != self.dtype or x.dim() != 2 or x.shape[1] != hidden or slots.shape != (t,)
                or plan.group.token_end - plan.group.token_start != t or not slots.is_contiguous()):
            raise ValueError(f"DecodeFastPath: a decode-only step of {self.dtype} rows [{t}, {hidden}], one slot "
                             f"and one sequence per token")
        step = DecodeStep(self, x, positions, plan, slots, kv_caches)
        for op in self.ops:
            op(step)
        return step.bufs[self.planner.output]


class DecodeStep:
    """What the ops of one step read and write: the slots' buffers and pointers, the residual stream's
    pointer (the stage's input until the first add writes the residual slot), the rotary rows and the
    attention plan's pointers."""

    def __init__(self, path: DecodeFastPath, x: torch.Tensor, positions: torch.Tensor,
                 plan: cpu_decode.KernelDecodePlan, slots: torch.Tensor,
                 kv_caches: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        t = x.shape[0]
        self.t, self.threads, self.x, self.kv_caches = t, torch.get_num_threads(), x, kv_caches
        self.bufs: list[Optional[torch.Tensor]] = [
            None if s is _FILLED else torch.empty((t,) if s[0] is None else (t, s[0]), dtype=s[1])
            for s in path.planner.shapes]
        self.ptrs = [0 if b is None else b.data_ptr() for b in self.bufs]
        self.stream_p = x.data_ptr()
        self.cos, self.sin = path.cos[positions], path.sin[positions]  # [T, D], one row per token
        self.cos_p, self.sin_p = self.cos.data_ptr(), self.sin.data_ptr()
        self.rope = (self.cos.view(t, 1, -1), self.sin.view(t, 1, -1))
        self.tables, self.lens, self.slots = plan.block_tables, plan.seq_lens, slots
        self.tables_p, self.tables_w = self.tables.data_ptr(), self.tables.shape[1]
        self.lens_p, self.slots_p = self.lens.data_ptr(), slots.data_ptr()


__all__ = ["DecodeFastPath", "DecodePlanner"]

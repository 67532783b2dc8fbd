"""The decoder of every family in ``runtime.model.architectures.registry`` over a paged KV cache.

Parameter names follow transformers' checkpoints, so an HF state dict loads as it is and a GGUF file is
renamed into the same names. Families differ only in switches of ArchConfig (qkv bias, q/k norms,
head_dim, tied embeddings, rope scaling, sliding windows, sparse MLPs, Gemma's norms and soft caps).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch
from torch import nn

from actorserve.kernels.attention import AttentionBackend
from actorserve.kernels.gemm import GgufQ8Weight, GgufWeight, PreparedWeight, linear, prepacked
from actorserve.runtime.model.architectures.arch_config import ArchConfig
from actorserve.runtime.model.architectures.layers import (Embedding, GatedMLP, Linear, RMSNorm, RotaryEmbedding,
                                                           apply_rotary, rope_inv_freq)
from actorserve.runtime.model.architectures.rope_scaling import rope_attention_factor
from actorserve.runtime.model.architectures.linear_attention import GatedDeltaNet, LinearStep
from actorserve.runtime.model.architectures.mla import MLAttention
from actorserve.runtime.model.architectures.moe import SparseMoE


class Attention(nn.Module):
    def __init__(self, cfg: ArchConfig, index: int) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        # q, k and v in one GEMM; the checkpoint's q_proj/k_proj/v_proj are row ranges of it (SHARDS). With
        # an output gate (Qwen3-Next), q_proj gives each head's q then its gate, side by side.
        self.gated = cfg.attn_output_gate
        self.q_size = cfg.num_heads * cfg.head_dim * (2 if self.gated else 1)
        self.kv_size = cfg.num_kv_heads * cfg.head_dim
        self.rotary_dim = cfg.rotary_size
        self.qkv_proj = Linear(cfg.hidden_size, self.q_size + 2 * self.kv_size, bias=cfg.attention_bias)
        self.o_proj = Linear(cfg.num_heads * cfg.head_dim, cfg.hidden_size, bias=False)
        # q/k norms per head (Qwen3), or over the whole projection (OLMoE)
        q_norm, k_norm = (self.q_size, self.kv_size) if cfg.qk_norm_whole else (cfg.head_dim, cfg.head_dim)
        self.qk_norm_whole = cfg.qk_norm_whole
        self.q_norm = RMSNorm(q_norm, cfg.rms_norm_eps) if cfg.qk_norm or cfg.qk_norm_whole else None
        self.k_norm = RMSNorm(k_norm, cfg.rms_norm_eps) if cfg.qk_norm or cfg.qk_norm_whole else None
        self.clip_qkv = cfg.clip_qkv
        self.scale = cfg.query_scale or cfg.head_dim ** -0.5
        self.window, self.softcap = cfg.window_of(index), cfg.attn_softcap

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor],
                kv_cache: tuple[torch.Tensor, torch.Tensor], meta: Any, backend: AttentionBackend) -> torch.Tensor:
        t = x.shape[0]
        qkv = self.qkv_proj(x)
        heads = self.num_heads
        if self.qk_norm_whole:  # (OLMoE: normed over each projection, then clipped where the model says)
            q, k = self.q_norm(qkv[:, :self.q_size]), self.k_norm(qkv[:, self.q_size:self.q_size + self.kv_size])
            qkv = torch.cat([q, k, qkv[:, self.q_size + self.kv_size:]], dim=-1)
            if self.clip_qkv is not None:
                qkv = qkv.clamp(-self.clip_qkv, self.clip_qkv)
        v = qkv[:, self.q_size + self.kv_size:].view(t, self.num_kv_heads, self.head_dim)
        gate = None
        if self.gated:
            q_gate = qkv[:, :self.q_size].view(t, heads, 2 * self.head_dim)
            q, gate = q_gate[..., :self.head_dim], q_gate[..., self.head_dim:].reshape(t, -1)
        if self.q_norm is None or self.qk_norm_whole:  # q and k are adjacent columns: rotate them together
            qk = self._rotate(qkv[:, :self.q_size + self.kv_size].view(t, -1, self.head_dim), rope)
            q, k = qk[:, :heads], qk[:, heads:]
        else:
            q = self.q_norm((q if gate is not None else qkv[:, :self.q_size]).reshape(t, heads, self.head_dim))
            k = self.k_norm(qkv[:, self.q_size:self.q_size + self.kv_size].reshape(t, self.num_kv_heads,
                                                                                    self.head_dim))
            q, k = self._rotate(q, rope), self._rotate(k, rope)
        out = backend.forward(q, k, v, kv_cache[0], kv_cache[1], meta, self.scale, self.window, self.softcap)
        out = out.reshape(t, -1)
        if gate is not None:
            out = out * torch.sigmoid(gate)
        return self.o_proj(out)

    def _rotate(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        """Rotary on each head's first rotary_dim values (all of them, but for partial rotary)."""
        if self.rotary_dim == self.head_dim:
            return apply_rotary(x, rope)
        return torch.cat([apply_rotary(x[..., :self.rotary_dim].contiguous(), rope), x[..., self.rotary_dim:]], -1)

    def decode_plan(self, planner, x):
        """``forward`` in the decode plan (``runtime.model.execution.decode_fast_path``)."""
        qkv = planner.product(self.qkv_proj, x, "qkv")
        return planner.product(self.o_proj, planner.attend(self, qkv), "o")


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ArchConfig, index: int) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        # the token mixer: softmax attention over the paged KV cache, or a gated delta net (Qwen3-Next)
        self.linear = index in cfg.linear_layers
        if self.linear:
            self.linear_attn = GatedDeltaNet(cfg)
        else:
            self.self_attn = MLAttention(cfg) if cfg.mla else Attention(cfg, index)
        # Llama's norm before the MLP; Gemma's norm of the attention output, with two more around the MLP
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.sandwich = cfg.sandwich_norms
        if self.sandwich:
            self.pre_feedforward_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
            self.post_feedforward_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        # the layer's rotary table: a sliding layer's own where the model has one (Gemma 3)
        self.local_rope = cfg.rope_local_theta is not None and index in cfg.sliding_layers
        if index in cfg.sparse_layers:
            self.mlp = SparseMoE(cfg.hidden_size, cfg.moe_intermediate_size, cfg.num_experts,
                                 cfg.num_experts_per_tok, cfg.norm_topk_prob, cfg.shared_expert_intermediate_size,
                                 cfg.moe_groups, cfg.moe_topk_group, cfg.routed_scaling_factor,
                                 cfg.shared_expert_gated, cfg.shared_expert_name)
        else:
            self.mlp = GatedMLP(cfg.hidden_size, cfg.intermediate_size, cfg.hidden_act)

    def forward(self, x, residual, rope, kv_cache, meta, backend, linear_step: Optional[LinearStep] = None):
        """The residual stream is ``residual + x`` (just ``x`` at the first layer, where residual is None):
        each sublayer's output is added in the next norm's fused pass, as vLLM does, so a layer costs no
        separate add. Returns this layer's (mlp output, residual), whose sum is the stream after it. A
        linear layer's ``kv_cache`` is its ``LinearLayerState``."""
        if residual is None:
            residual, normed = x, self.input_layernorm(x)
        else:
            residual, normed = self.input_layernorm.add_forward(residual, x)
        if self.linear:
            attended = self.linear_attn(normed, kv_cache, linear_step)
        else:
            attended = self.self_attn(normed, rope, kv_cache, meta, backend)
        if self.sandwich:
            residual, normed = self.pre_feedforward_layernorm.add_forward(
                residual, self.post_attention_layernorm(attended))
            return self.post_feedforward_layernorm(self.mlp(normed)), residual
        residual, normed = self.post_attention_layernorm.add_forward(residual, attended)
        return self.mlp(normed), residual

    def decode_plan(self, planner, delta):
        """``forward`` in the decode plan: ``delta`` is the previous layer's MLP output (None at a stage's
        first layer); returns this layer's."""
        normed = self.input_layernorm.decode_plan(planner, delta, planner.takes(self.self_attn.qkv_proj), "normed")
        o = self.self_attn.decode_plan(planner, normed)
        normed = self.post_attention_layernorm.decode_plan(planner, o, planner.takes(self.mlp.gate_up_proj), "normed")
        return self.mlp.decode_plan(planner, normed)


@dataclass(frozen=True)
class Stage:
    """Which layers a pipeline stage holds; the first embeds tokens, the last normalises and samples."""

    start: int
    end: int
    first: bool
    last: bool

    @classmethod
    def of(cls, num_layers: int, rank: int, size: int) -> "Stage":
        if not 1 <= size <= num_layers:
            raise ValueError(f"pipeline_parallel_size {size} must be between 1 and the {num_layers} layers")
        counts = [num_layers // size + (1 if k < num_layers % size else 0) for k in range(size)]
        start = sum(counts[:rank])
        return cls(start, start + counts[rank], rank == 0, rank == size - 1)

    def owns(self, name: str, tied_embeddings: bool) -> bool:
        """Whether the HF-named parameter belongs to this stage."""
        if name.startswith("model.layers."):
            return self.start <= int(name.split(".")[2]) < self.end
        if name.startswith("model.embed_tokens."):
            return self.first or (self.last and tied_embeddings)  # the last stage's lm_head, where tied
        return self.last  # model.norm, lm_head


class DecoderBody(nn.Module):
    def __init__(self, cfg: ArchConfig, stage: Stage) -> None:
        super().__init__()
        tied_head = stage.last and cfg.tie_word_embeddings
        # _weight: no random init (the loader writes every row; on the meta device normal_ would import dynamo)
        self.embed_tokens = (Embedding(cfg.vocab_size, cfg.hidden_size,
                                          _weight=torch.empty(cfg.vocab_size, cfg.hidden_size))
                             if stage.first or tied_head else None)
        # Keyed by the global layer index, so parameter names match the checkpoint on every stage.
        self.layers = nn.ModuleDict({str(i): DecoderLayer(cfg, i) for i in range(stage.start, stage.end)})
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps) if stage.last else None


class CausalLM(nn.Module):
    """Built on the meta device, materialised empty by the loader, weights loaded, then ``init_buffers``
    (rotary tables).

    A pipeline stage builds only its own layers; ``forward`` takes token ids on the first stage and the
    previous stage's hidden states elsewhere, and returns normalised hidden states on the last."""

    def __init__(self, cfg: ArchConfig, max_positions: int, stage: Optional[Stage] = None) -> None:
        super().__init__()
        self.cfg = cfg
        self.stage = stage or Stage(0, cfg.num_layers, True, True)
        self.max_positions = max_positions
        self.model = DecoderBody(cfg, self.stage)
        untied_head = self.stage.last and not cfg.tie_word_embeddings
        self.lm_head = Linear(cfg.hidden_size, cfg.vocab_size, bias=False) if untied_head else None
        self._tied_head: Optional[PreparedWeight] = None  # set by prepack or hold_tied_head
        self.rotary: Optional[RotaryEmbedding] = None
        self.rotary_local: Optional[RotaryEmbedding] = None  # the sliding layers' own (Gemma 3)

    @property
    def dtype(self) -> torch.dtype:
        return next(self.parameters()).dtype

    def checkpoint_layout(self) -> dict[str, tuple[str, int, int]]:
        """Every checkpoint tensor this model takes: name -> (parameter, first row, end row). Fused
        parameters take several checkpoint tensors, each a row range."""
        cfg = self.cfg
        q, kv, inter = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim, cfg.intermediate_size
        q *= 2 if cfg.attn_output_gate else 1  # (each head's q and its gate)
        shared = cfg.shared_expert_intermediate_size
        shards = {"self_attn.qkv_proj": [("self_attn.q_proj", 0, q), ("self_attn.k_proj", q, q + kv),
                                         ("self_attn.v_proj", q + kv, q + 2 * kv)],
                  "mlp.gate_up_proj": [("mlp.gate_proj", 0, inter), ("mlp.up_proj", inter, 2 * inter)],
                  f"mlp.{cfg.shared_expert_name}.gate_up_proj": [
                      (f"mlp.{cfg.shared_expert_name}.gate_proj", 0, shared),
                      (f"mlp.{cfg.shared_expert_name}.up_proj", shared, 2 * shared)]}
        layout = {}
        sizes = [(name, p.shape[0]) for name, p in self.named_parameters()]
        for name, rows in sizes + [(name, w.out_features) for name, w in self._held_blocks().items()]:
            experts = self._expert_shards(name)
            if experts is not None:
                layout.update({ckpt: (name, start, end) for ckpt, start, end in experts})
                continue
            fused = None if cfg.fused_checkpoint else \
                next(((f, parts) for f, parts in shards.items() if f".{f}." in name), None)
            if fused is None:
                layout[name] = (name, 0, rows)
                continue
            for part, start, end in fused[1]:
                layout[name.replace(fused[0], part)] = (name, start, end)
        return layout

    def _expert_shards(self, name: str) -> Optional[list[tuple[str, int, int]]]:
        """Where a sparse MLP's parameter comes from in the checkpoint (its per-expert tensors, or the
        router under the family's prefix); None for every other parameter."""
        if ".mlp." not in name or not self.cfg.sparse_layers:
            return None
        layer, _, local = name.partition(".mlp.")
        moe = self.get_submodule(f"{layer}.mlp")
        if not isinstance(moe, SparseMoE):
            return None
        prefix = f"{layer}.{self.cfg.moe_prefix}"
        shards = moe.checkpoint_shards(local, prefix, self.cfg.expert_names)
        if shards is not None:
            return shards
        if self.cfg.moe_prefix != "mlp":  # the router (and anything else) under the checkpoint's own prefix
            return [(f"{prefix}.{local}", 0, self.get_parameter(name).shape[0])]
        return None

    def _held_blocks(self) -> dict[str, GgufWeight | GgufQ8Weight]:
        """Weights held as GGUF blocks (no longer parameters), by the parameter name they replace."""
        held = {}
        for name, m in self.named_modules():
            w = m.blocks if isinstance(m, Embedding) else m.packed if isinstance(m, Linear) else None
            if isinstance(w, (GgufWeight, GgufQ8Weight)):
                held[f"{name}.weight"] = w
        return held

    def checkpoint_tensor(self, name: str) -> torch.Tensor:
        """The view of a parameter that holds the named checkpoint tensor (decoded, where it is blocks)."""
        param, start, end = self.checkpoint_layout()[name]
        held = self._held_blocks()
        if param in held:
            return held[param].dequantize()[start:end]
        return dict(self.named_parameters())[param][start:end]

    @property
    def num_local_layers(self) -> int:
        return len(self.model.layers)

    def init_buffers(self, rope_freq_factors: Optional[torch.Tensor] = None) -> None:
        cfg = self.cfg
        dim = cfg.rotary_size
        inv_freq = rope_inv_freq(dim, cfg.rope_theta, cfg.rope_scaling, rope_freq_factors)
        device = next(self.parameters()).device
        scale = rope_attention_factor(cfg.rope_scaling)  # (YaRN's; 1 for the others)
        self.rotary = RotaryEmbedding(dim, self.max_positions, inv_freq, scale).to(device)
        if cfg.rope_local_theta is not None:
            local = rope_inv_freq(dim, cfg.rope_local_theta, None, rope_freq_factors)
            self.rotary_local = RotaryEmbedding(dim, self.max_positions, local).to(device)

    def offset_norms(self) -> None:
        """Every RMSNorm weight w becomes 1 + w (in fp32, then the model's dtype): what Gemma's
        checkpoints mean by their norms, held so that the norms compute as every other family's."""
        with torch.no_grad():
            for m in self.modules():
                if isinstance(m, RMSNorm):
                    m.weight.copy_(m.weight.float() + 1.0)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                kv_caches: list[tuple[torch.Tensor, torch.Tensor]], meta: Any,
                backend: AttentionBackend, hidden_in: Optional[torch.Tensor] = None,
                linear_step: Optional[LinearStep] = None) -> torch.Tensor:
        """``meta`` is the attention backend's plan of the step (``backend.prepare``); ``kv_caches`` holds
        one entry per local layer (a GDN layer's is its state), ``linear_step`` the step's sequences for
        the GDN layers."""
        x = self.model.embed_tokens(input_ids) if self.stage.first else hidden_in
        if self.stage.first and self.cfg.embed_scale:  # (Gemma: sqrt(hidden_size) in the model's dtype)
            x = x * torch.tensor(self.cfg.hidden_size ** 0.5, dtype=x.dtype)
        rope = self.rotary.table(positions, x.dtype)
        rope_local = self.rotary_local.table(positions, x.dtype) if self.rotary_local is not None else None
        residual = None
        for layer, kv in zip(self.model.layers.values(), kv_caches):
            x, residual = layer(x, residual, rope_local if layer.local_rope else rope, kv, meta, backend, linear_step)
        if residual is None:  # a stage without layers
            return self.model.norm(x) if self.stage.last else x
        if self.stage.last:
            return self.model.norm.add_forward(residual, x)[1]
        return residual + x

    def decode_plan(self, planner) -> None:
        """``forward`` in the decode plan (``runtime.model.execution.decode_fast_path``), for a stage with layers."""
        planner.embedding(self.model.embed_tokens if self.stage.first else None)
        delta = None
        for layer in self.model.layers.values():
            delta = layer.decode_plan(planner, delta)
        if self.stage.last:
            planner.final_norm(self.model.norm, delta)
        else:
            planner.residual_out(delta)

    def prepack(self) -> int:
        """Put every linear's weight in the prepacked layout where that path takes it (bf16 on CPU); a tied
        lm_head gets a packed copy of the embedding table, which stays plain for lookups. Returns how many
        matrices were packed."""
        for m in self.modules():
            if isinstance(m, SparseMoE):
                m.decide_router()
        packed = sum(m.prepack() for m in self.modules() if isinstance(m, Linear))
        table = self.model.embed_tokens.weight if self.lm_head is None and self.stage.last else None
        if table is not None and prepacked.applies(table):
            self._tied_head = prepacked.PackedWeight(table.detach())
            packed += 1
        return packed

    def hold_tied_head(self, blocks: Optional[GgufWeight]) -> None:
        """A tied lm_head's product from the GGUF embedding table's blocks (the table stays for lookups)."""
        self._tied_head = blocks

    def hold_q8_products(self) -> int:
        """Multiply every GGUF weight of block types the q8 products take by int8-quantized activations
        (``kernels.gemm.gguf_q8``); a tied lm_head and the lookups share the one repacked table (whose
        lookups decode it). Returns how many matrices were repacked."""
        count = sum(m.hold_q8_products() for m in self.modules() if isinstance(m, Linear))
        embed = self.model.embed_tokens
        if embed is not None and embed.blocks is not None:
            tied = self._tied_head is embed.blocks
            if embed.hold_q8_products():
                count += 1
                if tied:
                    self._tied_head = embed.blocks
        return count

    def quantize_int8(self) -> int:
        """Hold every linear of the layers as int8 (``kernels.gemm.int8``); the lm_head and the embedding
        table keep the model's dtype. Returns how many matrices were quantized."""
        return sum(m.quantize_int8() for m in self.model.modules() if isinstance(m, Linear))

    def num_parameters(self) -> int:
        """Weights of this stage, counting prepacked, int8 and GGUF-block matrices (no longer nn.Parameters)
        and not the packed copy of a tied lm_head."""
        packed = sum(m.packed.out_features * m.packed.in_features for m in self.modules()
                     if isinstance(m, Linear) and m.packed is not None)
        table = self.model.embed_tokens.blocks if self.model.embed_tokens is not None else None
        if table is not None:
            packed += table.out_features * table.in_features
        return packed + sum(p.numel() for p in self.parameters())

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits in the model's dtype; the sampler widens them to fp32 where it needs more than an argmax.
        Gemma 2 caps them by c * tanh(logits / c)."""
        if self.lm_head is not None:
            logits = self.lm_head(hidden)
        elif self._tied_head is not None:  # faster than the skinny kernel on the plain table even at 1 row
            logits = linear(hidden, None, None, self._tied_head)
        else:
            logits = linear(hidden, self.model.embed_tokens.weight)
        cap = self.cfg.final_softcap
        return torch.tanh(logits / cap) * cap if cap else logits

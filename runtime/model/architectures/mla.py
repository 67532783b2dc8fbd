"""Multi-head latent attention (DeepSeek-V2) over a compressed KV cache, with the absorbed projections.

A token's keys and values are made from one latent: c = norm(kv_a(x))[:kv_lora_rank], plus one shared
rotary key k_pe. The cache holds just [c | k_pe] (kv_lora_rank + qk_rope_head_dim values a token, one
"head"), never the per-head keys and values. Since head h's key is W_UK[h] c and its value W_UV[h] c, a
query's score is (W_UK[h]^T q_nope) . c + q_pe . k_pe, and its output W_UV[h] (sum_t p_t c_t): so each query
is first projected into the latent space ("absorbed"), attention runs as multi-query attention with one KV
head of [c | k_pe] (values: the same vectors, their first kv_lora_rank taken), and the result is projected
out by W_UV. Prefill and decode both take this form.

The step goes through the model's attention backend as any other layer's does, with the same per-step
plan (``backend.prepare``): so what captures a decode step in a CUDA graph (the triton backend's static
plan) captures an MLA decode whole, with no host-side work of its own.

Parameter names follow transformers' checkpoints. The rotary is DeepSeek's: on adjacent pairs of values.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from actorserve.kernels.attention import AttentionBackend
from actorserve.runtime.model.architectures.arch_config import ArchConfig
from actorserve.runtime.model.architectures.layers import Linear, RMSNorm


def rotary_interleaved(x: torch.Tensor, table: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """x [T, heads, D] rotated on the pairs (x[2i], x[2i + 1]) by frequency i, from the rotate-half table
    (cos [T, 1, D] of cat(f, f), signed sin [T, 1, D] of cat(-sin f, sin f)): the products transformers'
    complex form gives."""
    half = x.shape[-1] // 2
    cos, sin = table[0][..., :half].float(), table[1][..., half:].float()
    even, odd = x[..., 0::2].float(), x[..., 1::2].float()
    return torch.stack([even * cos - odd * sin, even * sin + odd * cos], dim=-1).flatten(-2).to(x.dtype)


class MLAttention(nn.Module):
    def __init__(self, cfg: ArchConfig) -> None:
        super().__init__()
        self.num_heads = cfg.num_heads
        self.nope, self.rope, self.v_dim, self.rank = (cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim,
                                                       cfg.kv_lora_rank)
        q_out = cfg.num_heads * (self.nope + self.rope)
        if cfg.q_lora_rank:
            self.q_a_proj = Linear(cfg.hidden_size, cfg.q_lora_rank, bias=cfg.attention_bias)
            self.q_a_layernorm = RMSNorm(cfg.q_lora_rank, 1e-6)
            self.q_b_proj = Linear(cfg.q_lora_rank, q_out, bias=False)
            self.q_proj = None
        else:
            self.q_proj = Linear(cfg.hidden_size, q_out, bias=False)
        self.kv_a_proj_with_mqa = Linear(cfg.hidden_size, self.rank + self.rope, bias=cfg.attention_bias)
        self.kv_a_layernorm = RMSNorm(self.rank, 1e-6)
        # torch's own Linear: its weight is read as W_UK and W_UV, never prepacked or quantized away
        self.kv_b_proj = nn.Linear(self.rank, cfg.num_heads * (self.nope + self.v_dim), bias=False)
        self.o_proj = Linear(cfg.num_heads * self.v_dim, cfg.hidden_size, bias=cfg.attention_bias)
        self.scale = cfg.query_scale
        self.window, self.softcap = 0, 0.0

    def _absorbed(self) -> tuple[torch.Tensor, torch.Tensor]:
        """W_UK [H, nope, rank] and W_UV [H, v, rank], views of kv_b_proj's weight."""
        w = self.kv_b_proj.weight.view(self.num_heads, self.nope + self.v_dim, self.rank)
        return w[:, :self.nope], w[:, self.nope:]

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor],
                kv_cache: tuple[torch.Tensor, torch.Tensor], meta: Any, backend: AttentionBackend) -> torch.Tensor:
        t = x.shape[0]
        q = self.q_proj(x) if self.q_proj is not None else self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x)))
        q = q.view(t, self.num_heads, self.nope + self.rope)
        latent = self.kv_a_proj_with_mqa(x)
        c = self.kv_a_layernorm(latent[:, :self.rank])
        k_pe = rotary_interleaved(latent[:, None, self.rank:], rope)
        q_pe = rotary_interleaved(q[..., self.nope:], rope)
        w_uk, w_uv = self._absorbed()
        q_latent = torch.einsum("thn,hnr->thr", q[..., :self.nope], w_uk)
        queries = torch.cat([q_latent, q_pe], dim=-1)  # [T, H, rank + rope]
        keys = torch.cat([c[:, None, :], k_pe], dim=-1)  # [T, 1, rank + rope]: the cache's one latent head
        out = backend.forward(queries, keys, keys, kv_cache[0], kv_cache[1], meta, self.scale)
        out = torch.einsum("thr,hvr->thv", out[..., :self.rank], w_uv)
        return self.o_proj(out.reshape(t, self.num_heads * self.v_dim))

"""Qwen3-Next's gated delta net (GDN) layer: linear attention over a recurrent state per sequence.

A sequence's state lives in its slot of the step's state cache (``LinearLayerState``, one per GDN layer):
the causal convolution's last inputs and the delta rule's state (fp32). The scheduler's KV manager hands
each running request a slot beside its KV blocks and takes it back when the request ends or is
preempted (``runtime.engine.kv_cache_manager``); a sequence whose chunk starts at position 0 starts from
zeros, so recomputing a preempted request rebuilds its state exactly. Prefix caching is off for such
models: a cached block of keys does not give back the recurrent state at its end.

Parameter names follow transformers' checkpoints (``linear_attn.*``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from actorserve.kernels import triton_route
from actorserve.kernels.linear_attention import causal_conv, gated_delta
from actorserve.runtime.model.architectures.arch_config import ArchConfig
from actorserve.runtime.model.architectures.layers import Linear

GATED_DELTA_TRITON = "actorserve.kernels.linear_attention.gated_delta_triton"  # a GPU's form


def conv_channels(cfg: ArchConfig) -> int:
    """The convolution's channels: q and k of every key head, v of every value head."""
    return (2 * cfg.linear_num_key_heads * cfg.linear_key_head_dim
            + cfg.linear_num_value_heads * cfg.linear_value_head_dim)


@dataclass
class LinearLayerState:
    """One GDN layer's states for every slot: conv [S, conv channels, kernel - 1] in the model's dtype,
    recurrent [S, value heads, key head dim, value head dim] in fp32."""

    conv: torch.Tensor
    recurrent: torch.Tensor

    @classmethod
    def zeros(cls, cfg: ArchConfig, slots: int, dtype: torch.dtype, device: torch.device) -> "LinearLayerState":
        return cls(torch.zeros(slots, conv_channels(cfg), cfg.linear_conv_kernel - 1, dtype=dtype, device=device),
                   torch.zeros(slots, cfg.linear_num_value_heads, cfg.linear_key_head_dim,
                               cfg.linear_value_head_dim, dtype=torch.float32, device=device))

    @staticmethod
    def bytes_per_slot(cfg: ArchConfig, dtype: torch.dtype) -> int:
        elem = torch.empty((), dtype=dtype).element_size()
        return conv_channels(cfg) * (cfg.linear_conv_kernel - 1) * elem + \
            4 * cfg.linear_num_value_heads * cfg.linear_key_head_dim * cfg.linear_value_head_dim


@dataclass
class LinearStep:
    """The step's sequences as the GDN layers see them: the first ``num_decodes`` rows are one token each
    of a decoding sequence; the prefill rows follow, sequence i being rows ``prefill_cu_seqlens[i] ..
    prefill_cu_seqlens[i + 1]`` after them. Each sequence has its state slot, and starts from zeros where
    it is fresh (its chunk starts at position 0)."""

    num_decodes: int
    decode_slots: torch.Tensor  # [num_decodes] int64
    decode_fresh: torch.Tensor  # [num_decodes] bool
    prefill_cu_seqlens: Sequence[int]
    prefill_slots: Sequence[int]
    prefill_fresh: Sequence[bool]


class GatedRMSNorm(nn.Module):
    """RMSNorm of each head's output, times SiLU of the gate z (transformers' Qwen3NextRMSNormGated: its
    weight is used as it is, unlike the model's other norms, which mean 1 + w)."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        h = self.weight * h.to(dtype)
        return (h * F.silu(gate.float())).to(dtype)


class _Conv(nn.Module):
    """Holds the depthwise convolution's weight [channels, 1, kernel] under the checkpoint's name."""

    def __init__(self, channels: int, kernel: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(channels, 1, kernel))


class GatedDeltaNet(nn.Module):
    def __init__(self, cfg: ArchConfig) -> None:
        super().__init__()
        self.hk, self.hv = cfg.linear_num_key_heads, cfg.linear_num_value_heads
        self.dk, self.dv = cfg.linear_key_head_dim, cfg.linear_value_head_dim
        if self.hv % self.hk:
            raise ValueError(f"linear_num_value_heads {self.hv} is not a multiple of linear_num_key_heads {self.hk}")
        self.key_dim, self.value_dim = self.hk * self.dk, self.hv * self.dv
        self.in_proj_qkvz = Linear(cfg.hidden_size, 2 * self.key_dim + 2 * self.value_dim, bias=False)
        self.in_proj_ba = Linear(cfg.hidden_size, 2 * self.hv, bias=False)
        self.conv1d = _Conv(conv_channels(cfg), cfg.linear_conv_kernel)
        self.dt_bias = nn.Parameter(torch.empty(self.hv))
        self.A_log = nn.Parameter(torch.empty(self.hv))
        self.norm = GatedRMSNorm(self.dv, cfg.rms_norm_eps)
        self.out_proj = Linear(self.value_dim, cfg.hidden_size, bias=False)

    def _split(self, x: torch.Tensor):
        """q, k [T, Hk, Dk], v, z [T, Hv, Dv], b, a [T, Hv] from the projections, whose columns are grouped
        by key head as the checkpoint lays them out."""
        t, r = x.shape[0], self.hv // self.hk
        qkvz = self.in_proj_qkvz(x).view(t, self.hk, 2 * self.dk + 2 * r * self.dv)
        q, k, v, z = torch.split(qkvz, [self.dk, self.dk, r * self.dv, r * self.dv], dim=2)
        b, a = torch.split(self.in_proj_ba(x).view(t, self.hk, 2 * r), [r, r], dim=2)
        return (q, k, v.reshape(t, self.hv, self.dv), z.reshape(t, self.hv, self.dv), b.reshape(t, self.hv),
                a.reshape(t, self.hv))

    def forward(self, x: torch.Tensor, state: LinearLayerState, step: LinearStep) -> torch.Tensor:
        t = x.shape[0]
        q, k, v, z, b, a = self._split(x)
        mixed = torch.cat([q.reshape(t, -1), k.reshape(t, -1), v.reshape(t, -1)], dim=1)
        weight = self.conv1d.weight[:, 0, :]
        nd = step.num_decodes
        convolved = torch.empty_like(mixed)
        if nd:
            fresh = step.decode_fresh
            if bool(fresh.any()):
                state.conv.index_fill_(0, step.decode_slots[fresh], 0)
                state.recurrent.index_fill_(0, step.decode_slots[fresh], 0)
            convolved[:nd] = causal_conv.conv_step(mixed[:nd], weight, state.conv, step.decode_slots)
        offsets = gated_delta.normalise_cu_seqlens(step.prefill_cu_seqlens, t - nd)
        for i, (lo, hi) in enumerate(zip(offsets, offsets[1:])):
            slot = step.prefill_slots[i]
            out, new = causal_conv.conv_ref(mixed[nd + lo:nd + hi], weight,
                                            None if step.prefill_fresh[i] else state.conv[slot])
            convolved[nd + lo:nd + hi] = out
            state.conv[slot] = new.to(state.conv.dtype)
        q, k, v = torch.split(convolved, [self.key_dim, self.key_dim, self.value_dim], dim=1)
        q, k, v = q.reshape(t, self.hk, self.dk), k.reshape(t, self.hk, self.dk), v.reshape(t, self.hv, self.dv)
        # the gates in fp32 whatever the model's dtype: they compound through the recurrence
        beta = torch.sigmoid(b.float())
        g = -self.A_log.float().exp() * F.softplus(a.float() + self.dt_bias.float())
        core = torch.empty(t, self.hv, self.dv, dtype=torch.float32, device=x.device)
        if nd:  # one launch on a GPU (kernels.linear_attention.gated_delta_triton), the torch step elsewhere
            kernel = triton_route.for_tensor(x, GATED_DELTA_TRITON) or gated_delta
            core[:nd] = kernel.recurrent_step(q[:nd], k[:nd], v[:nd], g[:nd], beta[:nd], state.recurrent,
                                              step.decode_slots)
        if t > nd:  # the prefill chunks: one triton launch on a GPU, the chunked form elsewhere
            gpu = triton_route.for_tensor(x, GATED_DELTA_TRITON)
            varlen = gpu.recurrent_varlen if gpu is not None else gated_delta.chunked_varlen
            core[nd:] = varlen(q[nd:], k[nd:], v[nd:], g[nd:], beta[nd:], offsets, state.recurrent,
                               step.prefill_slots, step.prefill_fresh)
        out = self.norm(core.to(x.dtype).reshape(-1, self.dv), z.reshape(-1, self.dv))
        return self.out_proj(out.reshape(t, self.value_dim))

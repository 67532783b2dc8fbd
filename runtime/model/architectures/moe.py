"""Sparse mixture-of-experts MLP (Qwen2-MoE / Qwen3-MoE / Mixtral style): a router picks each token's top-k
experts, their gated MLPs run, and the outputs are summed with the routing weights; Qwen2-MoE adds a shared
expert behind a sigmoid gate, DeepSeek its shared experts ungated (and may limit each token's experts to its
best groups of experts, and scale the weights).

The experts' weights are two stacked parameters, gate|up [E * 2I, H] and down [E * H, I], so the
checkpoint's per-expert tensors are row ranges of them (``checkpoint_shards``), as q/k/v are of qkv_proj.
A step's (token, expert) pairs are sorted by expert once; each expert with tokens then runs one product
over its rows (no per-token Python loop), and ``index_add_`` scatters the weighted outputs back.

The router's logits go softmax -> top-k in fp32 whatever the model dtype (a bf16 softmax can reorder
experts whose logits are close), renormalised over the k where the model says so (``norm_topk_prob``;
Mixtral always). Its product takes a fast kernel only where every condition that kernel needs holds:
``RouterGate`` checks each one on its own, so a model that fails any takes the plain product.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from torch import nn
from torch.nn import functional as F

from actorserve.kernels import triton_route
from actorserve.kernels.elementwise import silu_mul
from actorserve.kernels.gemm import skinny

FUSED_MOE_TRITON = "actorserve.kernels.moe.fused_moe_triton"  # a GPU's fused kernel


@dataclass(frozen=True)
class RouterGate:
    """The router product's fast kernel (the skinny bf16 GEMM) and what it needs, each condition on its
    own: bf16 weights and activations, the CPU, few rows (a decode step), the kernel built here. Decided
    at load for the model (``for_model``) and per call for the rows."""

    dtype_ok: bool
    device_ok: bool
    kernel_ok: bool

    @classmethod
    def for_model(cls, dtype: torch.dtype, device: torch.device, kernel_available: Optional[bool] = None
                  ) -> "RouterGate":
        return cls(dtype == torch.bfloat16, torch.device(device).type == "cpu",
                   skinny.available() if kernel_available is None else kernel_available)

    def takes(self, rows: int) -> bool:
        return self.dtype_ok and self.device_ok and self.kernel_ok and 0 < rows <= skinny.MAX_ROWS


class SparseMoE(nn.Module):
    def __init__(self, hidden: int, inter: int, num_experts: int, top_k: int, renormalize: bool,
                 shared_inter: int = 0, groups: int = 0, topk_group: int = 0, scaling: float = 1.0,
                 shared_gated: bool = True, shared_name: str = "shared_expert") -> None:
        super().__init__()
        self.hidden, self.inter, self.num_experts, self.top_k = hidden, inter, num_experts, top_k
        self.renormalize, self.scaling = renormalize, scaling
        if groups and (num_experts % groups or not 0 < topk_group <= groups):
            raise ValueError(f"{num_experts} experts in {groups} groups, top {topk_group} groups: not a grouping")
        self.groups, self.topk_group = groups, topk_group
        self.gate = nn.Linear(hidden, num_experts, bias=False)  # the router
        self.experts_gate_up = nn.Parameter(torch.empty(num_experts * 2 * inter, hidden), requires_grad=False)
        self.experts_down = nn.Parameter(torch.empty(num_experts * hidden, inter), requires_grad=False)
        self.shared_expert_gate = None
        self.shared_name = shared_name  # the checkpoint's name of the shared expert(s)
        setattr(self, shared_name, None)
        if shared_inter:
            from actorserve.runtime.model.architectures.layers import GatedMLP

            setattr(self, shared_name, GatedMLP(hidden, shared_inter))
            if shared_gated:
                self.shared_expert_gate = nn.Linear(hidden, 1, bias=False)
        self.router_gate: Optional[RouterGate] = None  # set at load (``decide_router``)

    def decide_router(self) -> None:
        self.router_gate = RouterGate.for_model(self.gate.weight.dtype, self.gate.weight.device)

    def router_logits(self, x: torch.Tensor) -> torch.Tensor:
        gate = self.router_gate
        if gate is not None and gate.takes(x.shape[0]):
            return skinny.skinny_linear(x, self.gate.weight)
        return F.linear(x, self.gate.weight)

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Each token's top-k experts [T, k] and their weights [T, k] in x's dtype."""
        probs = self.router_logits(x).float().softmax(dim=-1)
        if self.groups:  # only experts of each token's best topk_group groups (a group scores its best expert)
            grouped = probs.view(-1, self.groups, self.num_experts // self.groups)
            best = grouped.amax(dim=-1).topk(self.topk_group, dim=-1).indices
            keep = torch.zeros(probs.shape[0], self.groups, dtype=torch.bool, device=probs.device)
            keep.scatter_(1, best, True)
            probs = grouped.masked_fill(~keep[:, :, None], 0.0).view_as(probs)
        weights, experts = probs.topk(self.top_k, dim=-1)
        if self.renormalize:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        if self.scaling != 1.0:
            weights = weights * self.scaling
        return experts, weights.to(x.dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x = x.reshape(-1, self.hidden)
        experts, weights = self.route(x)
        fused = triton_route.for_tensor(x, FUSED_MOE_TRITON)  # a GPU's fused kernel (None: the path below)
        if fused is not None:
            out = fused.fused_moe(x, self.experts_gate_up.view(self.num_experts, 2 * self.inter, self.hidden),
                                  self.experts_down.view(self.num_experts, self.hidden, self.inter), experts, weights)
            return self._add_shared(x, out).view(shape)
        flat = experts.flatten()
        order = flat.argsort(stable=True)
        tokens = order // self.top_k
        counts = torch.bincount(flat, minlength=self.num_experts).tolist()
        rows = x[tokens]
        scale = weights.flatten()[order][:, None]
        out = torch.zeros_like(x)
        two_i, start = 2 * self.inter, 0
        for e, n in enumerate(counts):
            if n == 0:
                continue
            seg = slice(start, start + n)
            h = silu_mul(F.linear(rows[seg], self.experts_gate_up[e * two_i:(e + 1) * two_i]))
            y = F.linear(h, self.experts_down[e * self.hidden:(e + 1) * self.hidden])
            out.index_add_(0, tokens[seg], y * scale[seg])
            start += n
        return self._add_shared(x, out).view(shape)

    def _add_shared(self, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        shared = getattr(self, self.shared_name)
        if shared is None:
            return out
        y = shared(x)
        return out + (y if self.shared_expert_gate is None else
                      torch.sigmoid(F.linear(x, self.shared_expert_gate.weight)) * y)

    def checkpoint_shards(self, param: str, prefix: str, names: tuple[str, str, str]
                          ) -> Optional[list[tuple[str, int, int]]]:
        """The checkpoint tensors (by name under ``prefix``, e.g. ``model.layers.3.mlp``) that are row
        ranges of ``param`` (this module's local parameter name); None for a parameter taken whole."""
        gate_name, up_name, down_name = names
        if param == "experts_gate_up":
            i = self.inter
            return [shard for e in range(self.num_experts) for shard in (
                (f"{prefix}.experts.{e}.{gate_name}.weight", 2 * i * e, 2 * i * e + i),
                (f"{prefix}.experts.{e}.{up_name}.weight", 2 * i * e + i, 2 * i * (e + 1)))]
        if param == "experts_down":
            h = self.hidden
            return [(f"{prefix}.experts.{e}.{down_name}.weight", h * e, h * (e + 1)) for e in range(self.num_experts)]
        return None

"""Qwen3-MoE: Qwen3's attention, sparse MLPs with top-k routing (renormalised where norm_topk_prob)."""
from typing import Any

from actorserve.runtime.model.architectures.family import Family, gguf_experts, qwen_experts, windows


def _switches(cfg: dict[str, Any]) -> dict[str, Any]:
    return dict(windows(cfg, qwen_switch=True), **qwen_experts(cfg, shared=False), qk_norm=True)


FAMILY = Family("qwen3_moe", ("Qwen3MoeForCausalLM",), ("qwen3_moe",), ("qwen3moe",),
                "Qwen3-MoE (top-k routing, renormalised where norm_topk_prob)", switches=_switches,
                gguf_switches=lambda a, names: gguf_experts(a, names, renormalize=True))

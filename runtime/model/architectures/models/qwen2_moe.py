"""Qwen1.5-MoE / Qwen2-MoE: Qwen2's attention, sparse MLPs with a shared expert behind a sigmoid gate."""
from typing import Any

from actorserve.runtime.model.architectures.family import Family, gguf_experts, qwen_experts, windows


def _switches(cfg: dict[str, Any]) -> dict[str, Any]:
    return dict(windows(cfg, qwen_switch=True), **qwen_experts(cfg, shared=True),
                attention_bias=cfg.get("attention_bias", True))


FAMILY = Family("qwen2_moe", ("Qwen2MoeForCausalLM",), ("qwen2_moe",), ("qwen2moe",),
                "Qwen1.5-MoE / Qwen2-MoE (top-k routing and a gated shared expert)", switches=_switches,
                gguf_switches=lambda a, names: gguf_experts(a, names, renormalize=False))

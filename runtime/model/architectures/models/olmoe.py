"""OLMoE: q and k norms over the whole projection, q, k and v clipped where the config says; every MLP
sparse, top-k routing without renormalisation (unless norm_topk_prob)."""
from typing import Any

from actorserve.runtime.model.architectures.family import Family, gguf_experts


def _switches(cfg: dict[str, Any]) -> dict[str, Any]:
    return dict(qk_norm_whole=True, clip_qkv=cfg.get("clip_qkv"), sparse_layers=tuple(range(cfg["num_hidden_layers"])),
                num_experts=cfg["num_experts"], num_experts_per_tok=cfg["num_experts_per_tok"],
                moe_intermediate_size=cfg["intermediate_size"], norm_topk_prob=bool(cfg.get("norm_topk_prob")))


FAMILY = Family("olmoe", ("OlmoeForCausalLM",), ("olmoe",), ("olmoe",),
                "OLMoE (q and k norms over the whole projection, top-k routing without renormalisation)",
                switches=_switches, gguf_switches=lambda a, names: dict(
                    gguf_experts(a, names, renormalize=False), qk_norm=False, qk_norm_whole=True,
                    clip_qkv=a("attention.clamp_kqv")))

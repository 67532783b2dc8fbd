"""DeepSeek-V2 / V2-Lite: multi-head latent attention (``runtime.model.architectures.mla``), whose cache holds
one latent head of kv_lora_rank + qk_rope_head_dim values, rotary on adjacent pairs; after the first dense layers,
routed experts (top-k of the best groups where the routing is grouped, weights scaled) and shared experts
added ungated."""
from typing import Any

from actorserve.runtime.model.architectures.family import Family
from actorserve.runtime.model.architectures.rope_scaling import yarn_mscale

ROUTINGS = ("greedy", "group_limited_greedy")


def _query_scale(cfg: dict[str, Any], qk_head_dim: int) -> float:
    """qk_head_dim ** -0.5, times YaRN's mscale(factor, mscale_all_dim) squared where the rope says so: DeepSeek
    scales every dim of q . k, not only the rotary ones (transformers' yarn_apply_mscale)."""
    scale = qk_head_dim ** -0.5
    rope = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    if rope.get("rope_type", rope.get("type", "default")) != "default" and rope.get("mscale_all_dim"):
        scale *= yarn_mscale(float(rope["factor"]), float(rope["mscale_all_dim"])) ** 2
    return scale


def _switches(cfg: dict[str, Any]) -> dict[str, Any]:
    method = cfg.get("topk_method") or "greedy"
    if method not in ROUTINGS:
        raise ValueError(f"unsupported DeepSeek routing {method!r}; supported: {', '.join(ROUTINGS)}")
    grouped = method == "group_limited_greedy"
    rank, nope, rope = cfg["kv_lora_rank"], cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"]
    return dict(mla=True, q_lora_rank=cfg.get("q_lora_rank") or 0, kv_lora_rank=rank, qk_nope_head_dim=nope,
                qk_rope_head_dim=rope, v_head_dim=cfg["v_head_dim"], num_kv_heads=1, head_dim=rank + rope,
                rotary_dim=rope, rope_interleaved=True, query_scale=_query_scale(cfg, nope + rope),
                sparse_layers=tuple(range(cfg.get("first_k_dense_replace", 0), cfg["num_hidden_layers"])),
                num_experts=cfg["n_routed_experts"], num_experts_per_tok=cfg["num_experts_per_tok"],
                moe_intermediate_size=cfg["moe_intermediate_size"], norm_topk_prob=False,
                shared_expert_intermediate_size=cfg["moe_intermediate_size"] * (cfg.get("n_shared_experts") or 0),
                moe_groups=cfg["n_group"] if grouped else 0, moe_topk_group=cfg["topk_group"] if grouped else 0,
                routed_scaling_factor=float(cfg.get("routed_scaling_factor") or 1.0), shared_expert_gated=False,
                shared_expert_name="shared_experts")


def _gguf_switches(a: Any, names: set[str]) -> dict[str, Any]:
    """llama.cpp's deepseek2: the latent shapes from its MLA keys, the experts from its expert keys."""
    rank, rope = a("attention.kv_lora_rank"), a("rope.dimension_count")
    qk = a("attention.key_length_mla")
    layers, experts, width = a("block_count"), a("expert_count", 0), a("expert_feed_forward_length")
    groups = a("expert_group_count", 0) or 0
    yarn = None
    if a("rope.scaling.type") == "yarn":  # (llama.cpp keeps 0.1 * mscale_all_dim, DeepSeek's mscale too)
        m_all = float(a("rope.scaling.yarn_log_multiplier", 0.0) or 0.0) / 0.1
        yarn = {"rope_type": "yarn", "factor": float(a("rope.scaling.factor")), "mscale": m_all,
                "mscale_all_dim": m_all, "original_max_position_embeddings": a("rope.scaling.original_context_length")}
    scale = qk ** -0.5 * (yarn_mscale(yarn["factor"], yarn["mscale_all_dim"]) ** 2 if yarn and yarn["mscale_all_dim"]
                          else 1.0)
    return dict(mla=True, q_lora_rank=a("attention.q_lora_rank", 0) or 0, kv_lora_rank=rank,
                qk_nope_head_dim=qk - rope, qk_rope_head_dim=rope, v_head_dim=a("attention.value_length_mla"),
                num_kv_heads=1, head_dim=rank + rope, rotary_dim=rope, rope_interleaved=True, query_scale=scale,
                rope_scaling=yarn,
                sparse_layers=tuple(range(a("leading_dense_block_count", 0), layers)) if experts else (),
                num_experts=experts, num_experts_per_tok=a("expert_used_count", 0), moe_intermediate_size=width,
                norm_topk_prob=bool(a("expert_weights_norm", False)),
                shared_expert_intermediate_size=width * (a("expert_shared_count", 0) or 0),
                moe_groups=groups if groups > 1 else 0,
                moe_topk_group=a("expert_group_used_count", 0) if groups > 1 else 0,
                routed_scaling_factor=float(a("expert_weights_scale", 1.0) or 1.0), shared_expert_gated=False,
                shared_expert_name="shared_experts")


FAMILY = Family("deepseek_v2", ("DeepseekV2ForCausalLM",), ("deepseek_v2",), ("deepseek2",),
                "DeepSeek-V2 / V2-Lite (multi-head latent attention over a compressed KV cache, shared and routed "
                "experts, YaRN rope scaling)", switches=_switches, gguf_switches=_gguf_switches)

"""Qwen3-Next: gated delta nets (``runtime.model.architectures.linear_attention``) in three layers of four, between
full-attention layers whose q_proj also gives an output gate, with partial rotary and q/k norms; norms
meaning 1 + w; Qwen2-MoE-style experts with a gated shared expert."""
from typing import Any

from actorserve.runtime.model.architectures.family import Family, gguf_experts, qwen_experts


def _switches(cfg: dict[str, Any]) -> dict[str, Any]:
    types = cfg.get("layer_types") or ["linear_attention" if (i + 1) % cfg.get("full_attention_interval", 4)
                                       else "full_attention" for i in range(cfg["num_hidden_layers"])]
    return dict(qwen_experts(cfg, shared=True), qk_norm=True, norm_offset=True, attn_output_gate=True,
                linear_layers=tuple(i for i, t in enumerate(types) if t == "linear_attention"),
                linear_num_key_heads=cfg["linear_num_key_heads"], linear_num_value_heads=cfg["linear_num_value_heads"],
                linear_key_head_dim=cfg["linear_key_head_dim"], linear_value_head_dim=cfg["linear_value_head_dim"],
                linear_conv_kernel=cfg.get("linear_conv_kernel_dim", 4))


def _gguf_switches(a: Any, names: set[str]) -> dict[str, Any]:
    """llama.cpp's qwen3next: the GDN shapes from its ssm keys, a full-attention layer every
    ``full_attention_interval``, experts renormalised (as llama.cpp computes them)."""
    layers, interval = a("block_count"), a("full_attention_interval", 4)
    hk, hv = a("ssm.group_count"), a("ssm.time_step_rank")
    return dict(gguf_experts(a, names, renormalize=True), norm_offset=True, attn_output_gate=True,
                linear_layers=tuple(i for i in range(layers) if (i + 1) % interval),
                linear_num_key_heads=hk, linear_num_value_heads=hv, linear_key_head_dim=a("ssm.state_size"),
                linear_value_head_dim=a("ssm.inner_size") // hv, linear_conv_kernel=a("ssm.conv_kernel"),
                rotary_dim=a("rope.dimension_count"))


FAMILY = Family("qwen3_next", ("Qwen3NextForCausalLM",), ("qwen3_next",), ("qwen3next",),
                "Qwen3-Next (gated delta net linear attention interleaved with gated full attention, MoE)",
                switches=_switches, gguf_switches=_gguf_switches)

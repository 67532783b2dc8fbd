"""Mixtral: Mistral's attention, every MLP sparse with top-2 routing renormalised, its experts named w1/w3/w2
under block_sparse_moe."""
from typing import Any

from actorserve.runtime.model.architectures.family import Family, windows


def _switches(cfg: dict[str, Any]) -> dict[str, Any]:
    return dict(windows(cfg), sparse_layers=tuple(range(cfg["num_hidden_layers"])),
                num_experts=cfg["num_local_experts"], num_experts_per_tok=cfg["num_experts_per_tok"],
                moe_intermediate_size=cfg["intermediate_size"], norm_topk_prob=True, moe_prefix="block_sparse_moe",
                expert_names=("w1", "w3", "w2"))


FAMILY = Family("mixtral", ("MixtralForCausalLM",), ("mixtral",), (),
                "Mixtral 8x7B / 8x22B (top-2 routing, renormalised)", switches=_switches)

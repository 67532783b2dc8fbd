"""Qwen3 dense: RMSNorm on each head of q and k before rotary."""
from typing import Any

from actorserve.runtime.model.architectures.family import Family, windows


def _switches(cfg: dict[str, Any]) -> dict[str, Any]:
    return dict(windows(cfg, qwen_switch=True), qk_norm=True)


FAMILY = Family("qwen3", ("Qwen3ForCausalLM",), ("qwen3",), ("qwen3",), "Qwen3 dense (q and k norms)",
                switches=_switches)

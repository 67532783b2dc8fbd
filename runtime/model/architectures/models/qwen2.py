"""Qwen2 / Qwen2.5: q, k and v biases; a sliding window where ``use_sliding_window`` says."""
from typing import Any

from actorserve.runtime.model.architectures.family import Family, windows


def _switches(cfg: dict[str, Any]) -> dict[str, Any]:
    return dict(windows(cfg, qwen_switch=True), attention_bias=cfg.get("attention_bias", True))


FAMILY = Family("qwen2", ("Qwen2ForCausalLM",), ("qwen2",), ("qwen2",), "Qwen2 / Qwen2.5 (q, k, v biases)",
                switches=_switches)

"""Phi-3 / Phi-3.5 mini: checkpoints that store qkv_proj and gate_up_proj fused, as the decoder holds them;
a sliding window."""
from typing import Any

from actorserve.runtime.model.family import Family, windows


def _switches(cfg: dict[str, Any]) -> dict[str, Any]:
    return dict(windows(cfg), fused_checkpoint=True)


FAMILY = Family("phi3", ("Phi3ForCausalLM",), ("phi3",), (),
                "Phi-3 / Phi-3.5 mini (fused qkv and gate-up weights, sliding window; without LongRoPE scaling)",
                switches=_switches)

"""Phi-3 / Phi-3.5 mini: checkpoints that store qkv_proj and gate_up_proj fused, as the decoder holds them;
a sliding window."""
from typing import Any

from actorserve.runtime.model.architectures.family import Family, windows


def _switches(cfg: dict[str, Any]) -> dict[str, Any]:
    return dict(windows(cfg), fused_checkpoint=True)


def _gguf_switches(a: Any, names: set[str]) -> dict[str, Any]:
    window = a("attention.sliding_window", 0) or 0
    layers, positions = a("block_count"), a("context_length", 2048)
    slides = 0 < window < positions
    return dict(fused_checkpoint=True, sliding_window=window if slides else None,
                sliding_layers=tuple(range(layers)) if slides else ())


FAMILY = Family("phi3", ("Phi3ForCausalLM",), ("phi3",), ("phi3",),
                "Phi-3 / Phi-3.5 mini (fused qkv and gate-up weights, sliding window; without LongRoPE scaling)",
                switches=_switches, gguf_switches=_gguf_switches)

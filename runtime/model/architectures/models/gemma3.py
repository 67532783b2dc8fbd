"""Gemma 3 (text): Gemma 2's layers with q and k norms, five sliding layers in six with their own rotary
base (the config's per-layer-type rope, read for every family), no soft caps by default."""
from typing import Any

from actorserve.runtime.model.architectures.family import Family
from actorserve.runtime.model.architectures.models.gemma2 import gemma, gguf_gemma


def _switches(cfg: dict[str, Any]) -> dict[str, Any]:
    return dict(gemma(cfg), qk_norm=True)


def _gguf_switches(a: Any, names: set[str]) -> dict[str, Any]:
    """llama.cpp's Gemma 3: five sliding layers in six with the rotary base 10000 (fixed there); the global
    layers' base and scaling are the file's (read for every family)."""
    return dict(gguf_gemma(a, pattern=6, largest_layers=62), rope_local_theta=float(a("rope.freq_base_swa", 10000.0)))


FAMILY = Family("gemma3", ("Gemma3ForCausalLM",), ("gemma3_text",), ("gemma3",),
                "Gemma 3 text models (sliding layers with their own rotary base, q and k norms)", switches=_switches,
                gguf_switches=_gguf_switches)

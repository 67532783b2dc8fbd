"""Gemma 3 (text): Gemma 2's layers with q and k norms, five sliding layers in six with their own rotary
base (the config's per-layer-type rope, read for every family), no soft caps by default."""
from typing import Any

from actorserve.runtime.model.family import Family
from actorserve.runtime.model.models.gemma2 import gemma


def _switches(cfg: dict[str, Any]) -> dict[str, Any]:
    return dict(gemma(cfg), qk_norm=True)


FAMILY = Family("gemma3", ("Gemma3ForCausalLM",), ("gemma3_text",), (),
                "Gemma 3 text models (sliding layers with their own rotary base, q and k norms)", switches=_switches)

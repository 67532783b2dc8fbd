"""Rotary scalings' scalar factors, torch-free so that a family's config reading may use them (the tables
themselves are ``runtime.model.architectures.layers.rope_inv_freq``)."""
from __future__ import annotations

import math
from typing import Any, Optional


def yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    """YaRN's magnitude correction for a context ``factor`` times the original (0.1 m ln(factor) + 1)."""
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def rope_attention_factor(scaling: Optional[dict[str, Any]]) -> float:
    """What YaRN multiplies the cos and sin tables by (1 for every other scaling): the config's
    attention_factor, else mscale(factor, mscale) / mscale(factor, mscale_all_dim) where both are given,
    else mscale(factor)."""
    if scaling is None or scaling.get("rope_type", scaling.get("type")) != "yarn":
        return 1.0
    if scaling.get("attention_factor") is not None:
        return float(scaling["attention_factor"])
    factor, m, m_all = float(scaling["factor"]), scaling.get("mscale"), scaling.get("mscale_all_dim")
    if m and m_all:
        return yarn_mscale(factor, m) / yarn_mscale(factor, m_all)
    return yarn_mscale(factor)

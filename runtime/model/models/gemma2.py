"""Gemma 2: norms meaning 1 + w, before and after attention and the MLP; GELU (tanh); embeddings scaled by
sqrt(hidden); attention scaled by query_pre_attn_scalar and its scores and the logits soft-capped; sliding
and global layers alternating."""
from typing import Any

from actorserve.runtime.model.family import Family, windows


def gemma(cfg: dict[str, Any]) -> dict[str, Any]:
    """What Gemma 2 and 3 share."""
    return dict(windows(cfg), hidden_act="gelu_tanh", embed_scale=True, sandwich_norms=True, norm_offset=True,
                query_scale=float(cfg["query_pre_attn_scalar"]) ** -0.5,
                attn_softcap=float(cfg.get("attn_logit_softcapping") or 0.0),
                final_softcap=float(cfg.get("final_logit_softcapping") or 0.0))


FAMILY = Family("gemma2", ("Gemma2ForCausalLM",), ("gemma2",), (),
                "Gemma 2 (alternating sliding and global layers, attention and logit soft-capping)", switches=gemma)

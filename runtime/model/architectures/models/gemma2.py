"""Gemma 2: norms meaning 1 + w, before and after attention and the MLP; GELU (tanh); embeddings scaled by
sqrt(hidden); attention scaled by query_pre_attn_scalar and its scores and the logits soft-capped; sliding
and global layers alternating."""
from typing import Any, Callable

from actorserve.runtime.model.architectures.family import Family, windows


def gemma(cfg: dict[str, Any]) -> dict[str, Any]:
    """What Gemma 2 and 3 share."""
    return dict(windows(cfg), hidden_act="gelu_tanh", embed_scale=True, sandwich_norms=True, norm_offset=True,
                query_scale=float(cfg["query_pre_attn_scalar"]) ** -0.5,
                attn_softcap=float(cfg.get("attn_logit_softcapping") or 0.0),
                final_softcap=float(cfg.get("final_logit_softcapping") or 0.0))


def gguf_gemma(a: Callable[..., Any], pattern: int, largest_layers: int) -> dict[str, Any]:
    """What Gemma 2 and 3 share in llama.cpp's files, whose norms hold 1 + w already. llama.cpp fixes what
    the files leave out: layers i with i % pattern < pattern - 1 slide, and the attention scale is
    1 / sqrt(key_length), but 1 / sqrt(hidden / heads) in the largest model (``largest_layers`` layers),
    as those models' query_pre_attn_scalar says."""
    layers, window = a("block_count"), a("attention.sliding_window", 0) or 0
    slides = 0 < window < a("context_length", 8192)
    scale = a("embedding_length") / a("attention.head_count") if layers == largest_layers else a("attention.key_length")
    return dict(hidden_act="gelu_tanh", embed_scale=True, sandwich_norms=True, norm_offset=True,
                query_scale=float(scale) ** -0.5, attn_softcap=float(a("attn_logit_softcapping", 0.0) or 0.0),
                final_softcap=float(a("final_logit_softcapping", 0.0) or 0.0),
                sliding_window=window if slides else None,
                sliding_layers=tuple(i for i in range(layers) if i % pattern < pattern - 1) if slides else ())


FAMILY = Family("gemma2", ("Gemma2ForCausalLM",), ("gemma2",), ("gemma2",),
                "Gemma 2 (alternating sliding and global layers, attention and logit soft-capping)", switches=gemma,
                gguf_switches=lambda a, names: gguf_gemma(a, pattern=2, largest_layers=46))

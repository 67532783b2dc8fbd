"""What a model family is to the registry: the names checkpoints give it, and the switches of
``ArchConfig`` it sets from an HF config.json (``runtime.model.architectures.models.<family>``, one file each); plus the
config readings several families share (sliding windows, Qwen-style experts). Imports no torch."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

Switches = Callable[[dict[str, Any]], dict[str, Any]]


def _none(cfg: dict[str, Any]) -> dict[str, Any]:
    return {}


@dataclass(frozen=True)
class Family:
    name: str  # ArchConfig.arch
    hf_architectures: tuple[str, ...]
    hf_model_types: tuple[str, ...]
    gguf_architectures: tuple[str, ...]
    models: str  # what it covers, for the docs and the errors
    # the ArchConfig fields this family sets from a config.json, beyond the ones every family reads
    switches: Switches = field(default=_none, compare=False)
    # and from a GGUF file's metadata: given the reader of its "<arch>." keys and its tensor names
    gguf_switches: Callable[[Callable[..., Any], set[str]], dict[str, Any]] = field(
        default=lambda a, names: {}, compare=False)


def windows(cfg: dict[str, Any], qwen_switch: bool = False) -> dict[str, Any]:
    """Which layers slide, over how many tokens: every layer, those the config's ``layer_types`` call
    sliding, or (Qwen, where ``use_sliding_window`` turns it on) those from ``max_window_layers`` on. A
    window no shorter than the model's positions slides nowhere."""
    window = cfg.get("sliding_window")
    layers = cfg["num_hidden_layers"]
    if qwen_switch and not cfg.get("use_sliding_window"):
        return {}
    if not window or window >= cfg.get("max_position_embeddings", 2048):
        return {}
    types = cfg.get("layer_types")
    if types:
        sliding = tuple(i for i, t in enumerate(types) if t == "sliding_attention")
    elif qwen_switch:
        sliding = tuple(range(cfg.get("max_window_layers", layers), layers))
    else:
        sliding = tuple(range(layers))
    return dict(sliding_window=int(window), sliding_layers=sliding) if sliding else {}


def gguf_experts(a: Callable[..., Any], names: set[str], renormalize: bool) -> dict[str, Any]:
    """Sparse MLPs from llama.cpp's metadata: the layers with a router (``ffn_gate_inp``), the expert counts
    and widths; the renormalisation is the architecture's (llama.cpp fixes it per architecture)."""
    layers = a("block_count")
    return dict(sparse_layers=tuple(i for i in range(layers) if f"blk.{i}.ffn_gate_inp.weight" in names),
                num_experts=a("expert_count"), num_experts_per_tok=a("expert_used_count"),
                # (llama.cpp's Llama-shaped MoE files give the experts' width as the feed-forward length)
                moe_intermediate_size=a("expert_feed_forward_length") or a("feed_forward_length"),
                norm_topk_prob=renormalize,
                shared_expert_intermediate_size=a("expert_shared_feed_forward_length", 0) or 0)


def qwen_experts(cfg: dict[str, Any], shared: bool) -> dict[str, Any]:
    """Qwen-style sparse MLPs: every ``decoder_sparse_step``-th layer but ``mlp_only_layers``; with a gated
    shared expert where ``shared``."""
    layers = cfg["num_hidden_layers"]
    experts = cfg["num_experts"] if "num_experts" in cfg else cfg["num_local_experts"]  # (transformers 5 names it so)
    step = cfg.get("decoder_sparse_step", 1) or 1
    dense = set(cfg.get("mlp_only_layers") or [])
    return dict(sparse_layers=tuple(i for i in range(layers) if i not in dense and experts and (i + 1) % step == 0),
                num_experts=experts, num_experts_per_tok=cfg["num_experts_per_tok"],
                moe_intermediate_size=cfg["moe_intermediate_size"], norm_topk_prob=bool(cfg.get("norm_topk_prob")),
                shared_expert_intermediate_size=cfg.get("shared_expert_intermediate_size", 0) if shared else 0)

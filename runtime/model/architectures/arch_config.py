"""The shape of a decoder-only transformer, read from a GGUF header or an HF config.json."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from actorserve.runtime.model.architectures.registry import NAMES as SUPPORTED
from actorserve.runtime.model.architectures.registry import family_of_hf


@dataclass(frozen=True)
class ArchConfig:
    arch: str  # a family of ``runtime.model.architectures.registry``
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool = False  # q/k/v projections have a bias (Qwen2)
    qk_norm: bool = False  # RMSNorm on each head of q and k before rotary (Qwen3)
    rope_scaling: Optional[dict[str, Any]] = field(default=None, hash=False)
    eos_token_id: Optional[int] = None
    fused_checkpoint: bool = False  # the checkpoint stores qkv_proj and gate_up_proj fused, as we do (Phi-3)
    qk_norm_whole: bool = False  # RMSNorm over the whole q and k projections, before the heads split (OLMoE)
    clip_qkv: Optional[float] = None  # q, k and v clamped to [-clip, clip] (OLMoE's option)
    # mixture of experts (runtime.model.architectures.moe): the layers whose MLP is sparse, and its shape
    sparse_layers: tuple[int, ...] = ()
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = False  # renormalise the top-k routing weights to sum to 1
    shared_expert_intermediate_size: int = 0  # Qwen2-MoE's shared expert (0: none)
    moe_prefix: str = "mlp"  # where the checkpoint keeps a sparse MLP's tensors, under its layer
    expert_names: tuple[str, str, str] = ("gate_proj", "up_proj", "down_proj")  # each expert's gate, up, down
    # sliding windows: the layers that see only their last ``sliding_window`` keys (the rest see all)
    sliding_window: Optional[int] = None
    sliding_layers: tuple[int, ...] = ()
    rope_local_theta: Optional[float] = None  # the sliding layers' own rotary base (Gemma 3), else theirs is rope_theta
    # Gemma 2 / 3
    hidden_act: str = "silu"  # the gated MLP's activation: "silu", or "gelu_tanh"
    embed_scale: bool = False  # embeddings multiplied by sqrt(hidden_size)
    sandwich_norms: bool = False  # a norm after attention and around the MLP (pre and post feedforward)
    norm_offset: bool = False  # the checkpoint's RMSNorm weights w mean 1 + w (HF Gemma; GGUF stores 1 + w)
    query_scale: Optional[float] = None  # attention's scale, where it is not head_dim ** -0.5
    attn_softcap: float = 0.0  # attention scores capped by c * tanh(s / c) (0: none)
    final_softcap: float = 0.0  # logits capped so
    # hybrid linear attention (Qwen3-Next): the layers that are gated delta nets
    # (runtime.model.architectures.linear_attention)
    linear_layers: tuple[int, ...] = ()
    linear_num_key_heads: int = 0
    linear_num_value_heads: int = 0
    linear_key_head_dim: int = 0
    linear_value_head_dim: int = 0
    linear_conv_kernel: int = 0
    rotary_dim: int = 0  # rotary on the first rotary_dim of each head (partial rotary); 0: the whole head
    attn_output_gate: bool = False  # q_proj also gives a gate per head: the output times sigmoid(gate)
    rope_interleaved: bool = False  # rotary on adjacent pairs of values (DeepSeek), not on the two halves
    # multi-head latent attention (DeepSeek-V2, runtime.model.architectures.mla): the cache holds one latent "head" of
    # kv_lora_rank + qk_rope_head_dim values a token (num_kv_heads 1, head_dim that sum)
    mla: bool = False
    q_lora_rank: int = 0  # 0: q_proj straight from the hidden state
    kv_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    # DeepSeek's routing: top-k among the best ``moe_topk_group`` of ``moe_groups`` expert groups (0: no
    # groups), the weights scaled; its shared experts are added ungated
    moe_groups: int = 0
    moe_topk_group: int = 0
    routed_scaling_factor: float = 1.0
    shared_expert_gated: bool = True
    shared_expert_name: str = "shared_expert"

    def __post_init__(self) -> None:
        if self.arch not in SUPPORTED:
            raise ValueError(f"unsupported architecture {self.arch!r}; supported: {', '.join(SUPPORTED)}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads {self.num_heads} is not a multiple of num_kv_heads {self.num_kv_heads}")
        if self.sliding_layers and not (self.sliding_window and self.sliding_window > 0):
            raise ValueError(f"sliding layers need a positive sliding_window, got {self.sliding_window}")
        if self.hidden_act not in ("silu", "gelu_tanh"):
            raise ValueError(f"unsupported activation {self.hidden_act!r}; supported: silu, gelu_tanh")

    @property
    def rotary_size(self) -> int:
        return self.rotary_dim or self.head_dim

    @property
    def kv_cache_tensors(self) -> int:
        """Tensors a layer's cache holds: K and V, or MLA's one latent (read as both)."""
        return 1 if self.mla else 2

    @property
    def attention_layers(self) -> tuple[int, ...]:
        """The layers with softmax attention over the paged KV cache (the others keep a recurrent state)."""
        return tuple(i for i in range(self.num_layers) if i not in self.linear_layers)

    def window_of(self, layer: int) -> int:
        """The layer's sliding window in tokens, 0 where it sees every key."""
        return self.sliding_window if layer in self.sliding_layers else 0

    @property
    def all_layers_windowed(self) -> bool:
        """Every layer slides: keys that fall out of the window are never read again (the KV manager
        frees their blocks)."""
        return bool(self.sliding_layers) and len(self.sliding_layers) == self.num_layers

    @classmethod
    def from_hf(cls, cfg: dict[str, Any]) -> "ArchConfig":
        """The fields every family reads from a config.json, then its family's own switches
        (``runtime.model.architectures.models``), which may override them."""
        family = family_of_hf(cfg)
        heads = cfg["num_attention_heads"]
        rope = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
        partial = float(rope.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 1.0)) or 1.0)
        local_rope = None
        if "full_attention" in rope:  # per layer type (Gemma 3): the global layers' rope, and the local base
            local_rope = rope.get("sliding_attention") or {}
            rope = rope["full_attention"] or {}
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        theta = rope.get("rope_theta", cfg.get("rope_theta", 10000.0))
        eos = cfg.get("eos_token_id")
        head_dim = cfg.get("head_dim") or cfg["hidden_size"] // heads
        fields = dict(
            arch=family.name,
            vocab_size=cfg["vocab_size"],
            hidden_size=cfg["hidden_size"],
            intermediate_size=cfg["intermediate_size"],
            num_layers=cfg["num_hidden_layers"],
            num_heads=heads,
            num_kv_heads=cfg.get("num_key_value_heads") or heads,
            head_dim=head_dim,
            rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
            rope_theta=float(theta),
            max_position_embeddings=cfg.get("max_position_embeddings", 2048),
            tie_word_embeddings=cfg.get("tie_word_embeddings", False),
            attention_bias=cfg.get("attention_bias", False),
            rope_scaling=dict(rope) if rope_type not in ("default", None) else None,
            eos_token_id=eos[0] if isinstance(eos, list) else eos,
            rotary_dim=int(head_dim * partial) if partial != 1.0 else 0,
            rope_local_theta=None if local_rope is None else float(
                local_rope.get("rope_theta", cfg.get("rope_local_base_freq", 10000.0))),
        )
        fields.update(family.switches(cfg))
        return cls(**fields)

"""Read a GGUF file: its architecture config and its tensors, renamed to HF names, dequantized or (for
the linears of an fp32 model on the CPU kernels) as the file stores them.

llama.cpp stores Llama q/k projections permuted for its interleaved rotary; they are permuted back so
the rotate-half rotary of the decoder (and of transformers) applies.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, Iterator, Optional, Union

import numpy as np
import torch

from actorserve.kernels.gemm.gguf import TYPES as BLOCK_TYPES
from actorserve.runtime.errors import ModelLoadError
from actorserve.runtime.model.architectures.arch_config import ArchConfig
from actorserve.runtime.model.weights.gguf_dequant import dequantize
from actorserve.runtime.model.architectures.registry import family_of_gguf
from actorserve.runtime.model.weights.gguf_file import GGUFFile, TensorInfo

# every block type of llama.cpp's quantization presets (the CPU kernels' list, kernels/gemm/gguf_decode.h);
# elsewhere they are dequantized at load by gguf-py
SUPPORTED_TYPES = ("F32", "F16", "BF16", *BLOCK_TYPES)

_LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_qkv.weight": "self_attn.qkv_proj.weight",  # (Phi-3's fused q|k|v)
    "post_attention_norm.weight": "post_attention_layernorm.weight",  # (Gemma's norm of the attention output)
    "post_ffw_norm.weight": "post_feedforward_layernorm.weight",
    # multi-head latent attention (llama.cpp's deepseek2); its kv_b comes whole, or split in k_b and v_b
    "attn_q_a.weight": "self_attn.q_a_proj.weight",
    "attn_q_a_norm.weight": "self_attn.q_a_layernorm.weight",
    "attn_q_b.weight": "self_attn.q_b_proj.weight",
    "attn_kv_a_mqa.weight": "self_attn.kv_a_proj_with_mqa.weight",
    "attn_kv_a_norm.weight": "self_attn.kv_a_layernorm.weight",
    "attn_kv_b.weight": "self_attn.kv_b_proj.weight",
    # gated delta nets (llama.cpp's qwen3next); its in_proj_qkvz comes as attn_qkv and attn_gate, reordered
    "ssm_ba.weight": "linear_attn.in_proj_ba.weight",
    "ssm_conv1d.weight": "linear_attn.conv1d.weight",
    "ssm_dt.bias": "linear_attn.dt_bias",
    "ssm_a": "linear_attn.A_log",
    "ssm_norm.weight": "linear_attn.norm.weight",
    "ssm_out.weight": "linear_attn.out_proj.weight",
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
    # mixture of experts (llama.cpp's qwen2moe / qwen3moe): the router, the shared expert and its gate
    "ffn_gate_inp.weight": "mlp.gate.weight",
    "ffn_gate_shexp.weight": "mlp.shared_expert.gate_proj.weight",
    "ffn_up_shexp.weight": "mlp.shared_expert.up_proj.weight",
    "ffn_down_shexp.weight": "mlp.shared_expert.down_proj.weight",
    "ffn_gate_inp_shexp.weight": "mlp.shared_expert_gate.weight",
}
# the experts of a layer, stacked [E, rows, columns] in one tensor each; a checkpoint's are one per expert
_EXPERT_STACKS = {"ffn_gate_exps.weight": "gate_proj", "ffn_up_exps.weight": "up_proj",
                  "ffn_down_exps.weight": "down_proj"}
_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
ROPE_FREQS = "rope_freqs.weight"  # llama3-style per-frequency divisors, applied to the rotary table
_BLOCK = re.compile(r"^blk\.(\d+)\.(.+)$")


def _field(reader: GGUFFile, key: str, default=None):
    return reader.fields.get(key, default)


def read_config(reader: GGUFFile) -> ArchConfig:
    arch = _field(reader, "general.architecture")
    family = family_of_gguf(arch)  # ModelLoadError naming what is supported
    a = lambda key, default=None: _field(reader, f"{arch}.{key}", default)  # noqa: E731
    names = {t.name for t in reader.tensors}
    vocab = a("vocab_size") or len(reader.fields.get("tokenizer.ggml.tokens", ()))
    if not vocab:
        raise ModelLoadError(f"{reader.path} gives neither {arch}.vocab_size nor a tokenizer vocabulary")
    heads = a("attention.head_count")
    hidden = a("embedding_length")
    scaling, factor = a("rope.scaling.type"), a("rope.scaling.factor")
    rope_scaling = None  # (llama3's scaling comes as rope_freqs, per frequency)
    if scaling == "linear" and factor:
        rope_scaling = {"rope_type": "linear", "factor": float(factor)}
    elif scaling == "yarn" and factor:
        rope_scaling = {"rope_type": "yarn", "factor": float(factor),
                        "original_max_position_embeddings": a("rope.scaling.original_context_length")}
    fields = dict(
        rope_scaling=rope_scaling,
        arch=family.name, vocab_size=int(vocab), hidden_size=hidden, intermediate_size=a("feed_forward_length"),
        num_layers=a("block_count"), num_heads=heads, num_kv_heads=a("attention.head_count_kv", heads),
        head_dim=a("attention.key_length", hidden // heads), rms_norm_eps=a("attention.layer_norm_rms_epsilon"),
        rope_theta=float(a("rope.freq_base", 10000.0)), max_position_embeddings=a("context_length", 2048),
        tie_word_embeddings="output.weight" not in names,
        # (any layer's: a hybrid model's first layer may have no softmax attention)
        attention_bias=any(n.endswith(".attn_q.bias") for n in names),
        qk_norm=any(n.endswith(".attn_q_norm.weight") for n in names),
        eos_token_id=_field(reader, "tokenizer.ggml.eos_token_id"),
    )
    # the family's own reading of the file (runtime.model.architectures.models)
    fields.update(family.gguf_switches(a, names))
    return ArchConfig(**fields)


def _hf_name(name: str) -> str:
    if name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[name]
    m = _BLOCK.match(name)
    if m and m.group(2) in _LAYER_NAMES:
        return f"model.layers.{m.group(1)}.{_LAYER_NAMES[m.group(2)]}"
    if name == ROPE_FREQS:
        return name
    raise ModelLoadError(f"GGUF tensor {name!r} has no place in the model")


def _checkpoint_name(name: str, cfg: Optional[ArchConfig]) -> str:
    """``_hf_name``, with Phi-3's ffn_up (gate|up fused, as the decoder holds it) named so, and Gemma's
    ffn_norm (the norm before its MLP, where Llama's post_attention_layernorm is)."""
    hf = _hf_name(name)
    if cfg is not None and cfg.fused_checkpoint and hf.endswith("mlp.up_proj.weight"):
        return hf.replace("mlp.up_proj", "mlp.gate_up_proj")
    if cfg is not None and cfg.sandwich_norms and name.endswith(".ffn_norm.weight"):
        return hf.replace("post_attention_layernorm", "pre_feedforward_layernorm")
    if cfg is not None and cfg.shared_expert_name != "shared_expert" and ".mlp.shared_expert." in hf:
        return hf.replace(".mlp.shared_expert.", f".mlp.{cfg.shared_expert_name}.")  # (DeepSeek's plural)
    return hf


def hf_name_or_none(name: str, cfg: Optional[ArchConfig] = None) -> Optional[str]:
    """The HF name of a GGUF tensor, or None where it has no place (``iter_tensors`` raises for those)."""
    try:
        return _checkpoint_name(name, cfg)
    except ModelLoadError:
        return None


def _unpermute(w: torch.Tensor, n_head: int) -> torch.Tensor:
    dim = w.shape[0] // n_head // 2
    return w.reshape(n_head, dim, 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


@dataclass
class StoredBlocks:
    """A GGUF matrix as the file stores it: ``blocks`` [rows, row bytes] uint8 of ``type_name``, the
    matrix being ``shape`` (rows, columns) once decoded."""

    type_name: str
    blocks: torch.Tensor
    shape: tuple[int, int]


def stored_blocks(reader: GGUFFile, t: TensorInfo) -> StoredBlocks:
    """The tensor's blocks, copied out of the mapping (which may then close)."""
    blocks = torch.from_numpy(np.array(reader.tensor_data(t), dtype=np.uint8).reshape(t.dims[0], -1))
    return StoredBlocks(t.type_name, blocks, t.dims)


def iter_tensors(reader: GGUFFile, cfg: ArchConfig, wanted: Callable[[str], bool] = lambda name: True,
                 keep: Callable[[str, str, tuple[int, ...]], bool] = lambda name, type_name, shape: False,
                 ) -> Iterator[tuple[str, Union[torch.Tensor, StoredBlocks]]]:
    """HF-named fp32 tensors; ``wanted`` filters by name before anything is dequantized. A tensor that
    ``keep(name, type, shape)`` accepts comes as its ``StoredBlocks`` instead, not decoded."""
    latent_halves: dict[str, dict[str, torch.Tensor]] = {}  # a layer's attn_k_b / attn_v_b, until both came
    qkvz_halves: dict[str, dict[str, torch.Tensor]] = {}  # a GDN layer's attn_qkv / attn_gate, likewise
    for t in reader.tensors:
        m = _BLOCK.match(t.name)
        if m and m.group(2) in _EXPERT_STACKS:  # one checkpoint tensor per expert, decoded
            names = [f"model.layers.{m.group(1)}.mlp.experts.{e}.{_EXPERT_STACKS[m.group(2)]}.weight"
                     for e in range(t.dims[0])]
            if any(wanted(n) for n in names):
                stack = dequantize(reader.tensor_data(t), t.type_name, t.dims)
                yield from ((n, stack[e]) for e, n in enumerate(names) if wanted(n))
            continue
        if m and m.group(2) in ("attn_k_b.weight", "attn_v_b.weight"):
            name = f"model.layers.{m.group(1)}.self_attn.kv_b_proj.weight"
            if wanted(name):
                halves = latent_halves.setdefault(name, {})
                halves[m.group(2)[:6]] = dequantize(reader.tensor_data(t), t.type_name, t.dims)
                if len(halves) == 2:  # k_b [H, rank, nope] and v_b [H, v, rank]: kv_b's rows, head by head
                    k_b, v_b = halves["attn_k"].transpose(1, 2), halves["attn_v"]
                    yield name, torch.cat([k_b, v_b], dim=1).reshape(-1, v_b.shape[-1])
                    del latent_halves[name]
            continue
        if m and cfg.linear_layers and int(m.group(1)) in cfg.linear_layers and \
                m.group(2) in ("attn_qkv.weight", "attn_gate.weight"):
            name = f"model.layers.{m.group(1)}.linear_attn.in_proj_qkvz.weight"
            if wanted(name):
                halves = qkvz_halves.setdefault(name, {})
                halves[m.group(2)] = dequantize(reader.tensor_data(t), t.type_name, t.dims)
                if len(halves) == 2:
                    yield name, _qkvz(halves["attn_qkv.weight"], halves["attn_gate.weight"], cfg)
                    del qkvz_halves[name]
            continue
        name = _checkpoint_name(t.name, cfg)
        if not wanted(name):
            continue
        if keep(name, t.type_name, t.dims):
            stored = stored_blocks(reader, t)
            stored.blocks = _llama_rows(name, cfg, stored.blocks).contiguous()  # rows are whole blocks
            yield name, stored
        else:
            tensor = _llama_rows(name, cfg, dequantize(reader.tensor_data(t), t.type_name, t.dims))
            if name.endswith("shared_expert_gate.weight"):  # (1-D there)
                tensor = tensor.view(1, -1)
            elif name.endswith("linear_attn.conv1d.weight"):  # (squeezed there)
                tensor = tensor.view(tensor.shape[0], 1, -1)
            elif name.endswith("linear_attn.A_log"):  # (llama.cpp stores A = -exp(A_log))
                tensor = torch.log(-tensor)
            yield name, tensor


def _qkvz(qkv: torch.Tensor, gate: torch.Tensor, cfg: ArchConfig) -> torch.Tensor:
    """A GDN layer's in_proj_qkvz rows as the checkpoint groups them (each key head's q, k, then its value
    heads' v and z), from llama.cpp's attn_qkv (all q, all k, all v) and attn_gate (all z)."""
    hk, dk, hidden = cfg.linear_num_key_heads, cfg.linear_key_head_dim, qkv.shape[-1]
    per_k = cfg.linear_num_value_heads // hk * cfg.linear_value_head_dim
    q, k, v = torch.split(qkv, [hk * dk, hk * dk, hk * per_k])
    parts = [q.view(hk, dk, hidden), k.view(hk, dk, hidden), v.view(hk, per_k, hidden), gate.view(hk, per_k, hidden)]
    return torch.cat(parts, dim=1).reshape(-1, hidden)


def _llama_rows(name: str, cfg: ArchConfig, rows: torch.Tensor) -> torch.Tensor:
    """A Llama q/k projection's rows (decoded, or as blocks) back in rotate-half order; others as they are."""
    if cfg.arch == "llama" and name.endswith(("q_proj.weight", "q_proj.bias")):
        return _unpermute(rows, cfg.num_heads)
    if cfg.arch == "llama" and name.endswith(("k_proj.weight", "k_proj.bias")):
        return _unpermute(rows, cfg.num_kv_heads)
    return rows


def check_types(reader: GGUFFile) -> None:
    """ModelLoadError for the first tensor of a type this engine does not compute, before any is read."""
    for t in reader.tensors:
        if t.type_name not in SUPPORTED_TYPES:
            raise ModelLoadError(f"GGUF tensor {t.name} has type {t.type_name}; "
                                 f"supported: {', '.join(SUPPORTED_TYPES)}")


def open_gguf(path: str) -> tuple[GGUFFile, ArchConfig]:
    reader = GGUFFile(path)
    check_types(reader)
    return reader, read_config(reader)

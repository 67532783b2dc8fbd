"""GGUF files of the families beyond Llama/Qwen2/Qwen3, as llama.cpp's converter lays them out (its
architecture names and metadata keys, each layer's experts stacked in one tensor per projection, the
shared expert's gate a vector, Phi-3's fused q|k|v and gate|up kept fused): every parameter loads equal
to the safetensors checkpoint's, and greedy generation from either file gives the same tokens."""
import dataclasses

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from actorserve import LLM, SamplingParams
from actorserve.runtime.model import gguf_weights
from actorserve.runtime.model.loader import load_model
from tests.conftest import save_tiny_model

SHAPES = {
    "qwen3_moe": ("qwen3moe", dict(head_dim=32, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=48,
                                   norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[1])),
    "qwen2_moe": ("qwen2moe", dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=40,
                                   shared_expert_intermediate_size=72, norm_topk_prob=False, decoder_sparse_step=1,
                                   mlp_only_layers=[])),
    "phi3": ("phi3", dict(pad_token_id=None, tie_word_embeddings=True, sliding_window=20)),  # fused tensors
}
_STACKS = {v: k for k, v in gguf_weights._EXPERT_STACKS.items()}


def _gguf_name(hf: str) -> str:
    inverse = {v: k for k, v in gguf_weights._GLOBAL_NAMES.items()}
    if hf in inverse:
        return inverse[hf]
    _, _, i, rest = hf.split(".", 3)
    rest = rest.replace("mlp.gate_up_proj", "mlp.up_proj")  # (Phi-3's ffn_up holds gate|up)
    return f"blk.{i}." + {v: k for k, v in gguf_weights._LAYER_NAMES.items()}[rest]


def write_gguf(hf_dir, path, arch, cfg):
    """The checkpoint as llama.cpp's converter writes it, in F32."""
    import gguf

    state = load_file(str(hf_dir / "model.safetensors"))
    writer = gguf.GGUFWriter(str(path), arch)
    for key, value in [("block_count", cfg.num_hidden_layers), ("context_length", cfg.max_position_embeddings),
                       ("embedding_length", cfg.hidden_size), ("feed_forward_length", cfg.intermediate_size),
                       ("attention.head_count", cfg.num_attention_heads),
                       ("attention.head_count_kv", cfg.num_key_value_heads), ("vocab_size", cfg.vocab_size),
                       ("attention.key_length",
                        getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads)]:
        writer.add_uint32(f"{arch}.{key}", value)
    if getattr(cfg, "num_experts", 0):
        for key, value in [("expert_count", cfg.num_experts), ("expert_used_count", cfg.num_experts_per_tok),
                           ("expert_feed_forward_length", cfg.moe_intermediate_size)]:
            writer.add_uint32(f"{arch}.{key}", value)
    if getattr(cfg, "sliding_window", None):
        writer.add_uint32(f"{arch}.attention.sliding_window", cfg.sliding_window)
    if getattr(cfg, "shared_expert_intermediate_size", 0):
        writer.add_uint32(f"{arch}.expert_shared_feed_forward_length", cfg.shared_expert_intermediate_size)
    writer.add_float32(f"{arch}.rope.freq_base", 10000.0)
    writer.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", cfg.rms_norm_eps)
    experts: dict[tuple[str, str], dict[int, np.ndarray]] = {}
    for name, tensor in state.items():
        w = tensor.numpy().astype(np.float32)
        if ".mlp.experts." in name:  # model.layers.L.mlp.experts.E.proj.weight: stacked per layer and proj
            parts = name.split(".")
            experts.setdefault((parts[2], parts[6]), {})[int(parts[5])] = w
            continue
        writer.add_tensor(_gguf_name(name), w.reshape(-1) if name.endswith("shared_expert_gate.weight") else w)
    for (layer, proj), by_expert in experts.items():
        writer.add_tensor(f"blk.{layer}.{_STACKS[proj]}", np.stack([by_expert[e] for e in sorted(by_expert)]))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.mark.parametrize("family", sorted(SHAPES))
def test_a_gguf_file_loads_as_its_checkpoint(family, tmp_path):
    import transformers

    arch, shape = SHAPES[family]
    hf_dir = save_tiny_model(family, tmp_path / "hf", seed=5, **shape)
    path = tmp_path / f"{family}.gguf"
    write_gguf(hf_dir, path, arch, transformers.AutoConfig.from_pretrained(hf_dir))
    from_gguf = load_model(str(path), "float32", skip_tokenizer=True)
    from_hf = load_model(str(hf_dir), "float32", skip_tokenizer=True)
    # (the file keeps eps as float32)
    assert from_gguf.cfg == dataclasses.replace(from_hf.cfg, rms_norm_eps=from_gguf.cfg.rms_norm_eps)
    assert from_gguf.cfg.rms_norm_eps == pytest.approx(from_hf.cfg.rms_norm_eps, rel=1e-6)
    for name in from_hf.model.checkpoint_layout():
        assert torch.equal(from_gguf.model.checkpoint_tensor(name), from_hf.model.checkpoint_tensor(name)), name
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    prompt = {"prompt_token_ids": [5, 77, 3, 190, 41, 8, 300, 12]}
    outs = [LLM(str(p), skip_tokenizer_init=True, max_model_len=256, kv_cache_memory=8 << 20).generate(
        prompt, params, use_tqdm=False)[0].outputs[0].token_ids for p in (path, hf_dir)]
    assert outs[0] == outs[1] and len(outs[0]) == 12

"""GGUF files of every family but Llama itself (tests/runtime/model/weights/test_loader.py), as llama.cpp's
converter lays them out (its architecture names and metadata keys, each layer's experts stacked in one
tensor per projection, the shared expert's gate a vector, Phi-3's fused q|k|v and gate|up kept fused,
Gemma's and Qwen3-Next's norms as 1 + w, DeepSeek's kv_b split, Qwen3-Next's GDN tensors regrouped): every
parameter loads equal to the safetensors checkpoint's, and greedy generation from either file gives the
same tokens. Mistral and Mixtral are written as llama.cpp writes them, as Llamas."""
import dataclasses

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from actorserve import LLM, SamplingParams
from actorserve.runtime.model.weights import gguf_weights
from actorserve.runtime.model.weights.loader import load_model
from tests.conftest import save_tiny_model

SHAPES = {
    "qwen2": ("qwen2", dict(tie_word_embeddings=True)),  # (q, k, v biases)
    "qwen3": ("qwen3", dict(head_dim=32)),  # (q and k norms)
    "qwen3_moe": ("qwen3moe", dict(head_dim=32, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=48,
                                   norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[1])),
    "qwen2_moe": ("qwen2moe", dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=40,
                                   shared_expert_intermediate_size=72, norm_topk_prob=False, decoder_sparse_step=1,
                                   mlp_only_layers=[])),
    "phi3": ("phi3", dict(pad_token_id=None, tie_word_embeddings=True, sliding_window=20)),  # fused tensors
    # (query_pre_attn_scalar = head_dim, as in the models llama.cpp serves, which take the scale so)
    "gemma2": ("gemma2", dict(head_dim=32, sliding_window=10, query_pre_attn_scalar=32, attn_logit_softcapping=1.5,
                              final_logit_softcapping=3.0, num_hidden_layers=3, tie_word_embeddings=True)),
    "gemma3": ("gemma3", dict(head_dim=32, sliding_window=9, query_pre_attn_scalar=32, num_hidden_layers=7,
                              tie_word_embeddings=True)),  # five sliding layers, a global one, a sliding one
    "olmoe": ("olmoe", dict(num_experts=5, num_experts_per_tok=2, norm_topk_prob=False, clip_qkv=3.0)),
    "mixtral": ("llama", dict(num_local_experts=4, num_experts_per_tok=2, sliding_window=None)),  # as llama.cpp
    "mistral": ("llama", dict(sliding_window=None)),  # (llama.cpp writes Mistral as a Llama, without its window)
    "llama-yarn": ("llama", dict(rope_parameters={"rope_type": "yarn", "factor": 4.0, "rope_theta": 10000.0,
                                                  "original_max_position_embeddings": 16})),  # (YaRN's keys)
    # latent attention with q's low rank, grouped routing, scaled weights, YaRN; kv_b split in k_b and v_b
    "deepseek_v2": ("deepseek2", dict(num_hidden_layers=3, num_key_value_heads=4, kv_lora_rank=32, q_lora_rank=40,
                                      qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16, n_routed_experts=8,
                                      num_experts_per_tok=2, moe_intermediate_size=32, n_shared_experts=2,
                                      first_k_dense_replace=1, topk_method="group_limited_greedy", n_group=4,
                                      topk_group=1, routed_scaling_factor=1.5, rope_parameters={
                                          "rope_type": "yarn", "factor": 40.0, "mscale": 0.707, "mscale_all_dim": 0.707,
                                          "original_max_position_embeddings": 32, "rope_theta": 10000.0})),
    # three gated delta nets and a gated full-attention layer, experts with a shared one in layers 1 and 3
    "qwen3_next": ("qwen3next", dict(num_hidden_layers=4, head_dim=32, linear_num_key_heads=2,
                                     linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=8,
                                     num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                                     shared_expert_intermediate_size=48, mlp_only_layers=[0, 2])),
}
RENAMES = {  # what llama.cpp calls the checkpoint names the shared tables do not cover
    "gemma2": {"pre_feedforward_layernorm": "ffn_norm", "post_attention_layernorm": "post_attention_norm"},
    "gemma3": {"pre_feedforward_layernorm": "ffn_norm", "post_attention_layernorm": "post_attention_norm"},
    "llama": {"block_sparse_moe.gate": "ffn_gate_inp"},
    "qwen3next": {"post_attention_layernorm": "post_attention_norm", "linear_attn.in_proj_ba": "ssm_ba",
                  "linear_attn.norm": "ssm_norm", "linear_attn.out_proj": "ssm_out"},
    "deepseek2": {"mlp.shared_experts.gate_proj": "ffn_gate_shexp", "mlp.shared_experts.up_proj": "ffn_up_shexp",
                  "mlp.shared_experts.down_proj": "ffn_down_shexp"},
}
EXPERT_PROJ = {"w1": "gate_proj", "w3": "up_proj", "w2": "down_proj"}  # Mixtral's names
_STACKS = {v: k for k, v in gguf_weights._EXPERT_STACKS.items()}


def _gguf_name(hf: str, arch: str) -> str:
    inverse = {v: k for k, v in gguf_weights._GLOBAL_NAMES.items()}
    if hf in inverse:
        return inverse[hf]
    _, _, i, rest = hf.split(".", 3)
    for ours, theirs in RENAMES.get(arch, {}).items():
        if rest.startswith(ours + "."):
            return f"blk.{i}.{theirs}.weight"
    rest = rest.replace("mlp.gate_up_proj", "mlp.up_proj")  # (Phi-3's ffn_up holds gate|up)
    return f"blk.{i}." + {v: k for k, v in gguf_weights._LAYER_NAMES.items()}[rest]


def _permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """What llama.cpp's converter does to Llama q/k rows."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_gguf(hf_dir, path, arch, cfg):
    """The checkpoint as llama.cpp's converter writes it, in F32."""
    import gguf

    state = load_file(str(hf_dir / "model.safetensors"))
    writer = gguf.GGUFWriter(str(path), arch)
    ints = {"block_count": cfg.num_hidden_layers, "context_length": cfg.max_position_embeddings,
            "embedding_length": cfg.hidden_size, "feed_forward_length": cfg.intermediate_size,
            "attention.head_count": cfg.num_attention_heads, "attention.head_count_kv": cfg.num_key_value_heads,
            "vocab_size": cfg.vocab_size,
            "attention.key_length": getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads}
    floats = {"attention.layer_norm_rms_epsilon": cfg.rms_norm_eps}
    experts = getattr(cfg, "num_experts", 0) or getattr(cfg, "num_local_experts", 0)
    if experts:
        ints.update(expert_count=experts, expert_used_count=cfg.num_experts_per_tok)
    if experts and arch != "llama":  # (llama.cpp's Llama-shaped MoE: the feed-forward length is the experts')
        ints["expert_feed_forward_length"] = getattr(cfg, "moe_intermediate_size", None) or cfg.intermediate_size
    if getattr(cfg, "shared_expert_intermediate_size", 0):
        ints["expert_shared_feed_forward_length"] = cfg.shared_expert_intermediate_size
    if getattr(cfg, "sliding_window", None):
        ints["attention.sliding_window"] = cfg.sliding_window
    for key in ("attn_logit_softcapping", "final_logit_softcapping"):
        if getattr(cfg, key, None):
            floats[key] = getattr(cfg, key)
    if getattr(cfg, "clip_qkv", None):
        floats["attention.clamp_kqv"] = cfg.clip_qkv
    if arch == "deepseek2":  # (llama.cpp's MLA as MQA: one KV head of the latent)
        rank, nope, rope_dim = cfg.kv_lora_rank, cfg.qk_nope_head_dim, cfg.qk_rope_head_dim
        ints.update({"leading_dense_block_count": cfg.first_k_dense_replace, "attention.kv_lora_rank": rank,
                     "attention.q_lora_rank": cfg.q_lora_rank, "attention.key_length": rank + rope_dim,
                     "attention.value_length": rank, "attention.key_length_mla": nope + rope_dim,
                     "attention.value_length_mla": cfg.v_head_dim, "rope.dimension_count": rope_dim,
                     "attention.head_count_kv": 1, "expert_count": cfg.n_routed_experts,
                     "expert_shared_count": cfg.n_shared_experts, "expert_group_count": cfg.n_group,
                     "expert_group_used_count": cfg.topk_group})
        floats["expert_weights_scale"] = cfg.routed_scaling_factor
    yarn = getattr(cfg, "rope_parameters", None) or {}
    if yarn.get("rope_type") == "yarn":  # (as llama.cpp's converter writes it; DeepSeek's mscale as a log multiplier)
        writer.add_string(f"{arch}.rope.scaling.type", "yarn")
        floats["rope.scaling.factor"] = yarn["factor"]
        ints["rope.scaling.original_context_length"] = yarn["original_max_position_embeddings"]
        if arch == "deepseek2":
            floats["rope.scaling.yarn_log_multiplier"] = 0.1 * yarn["mscale_all_dim"]
    if arch == "qwen3next":
        ints.update({"ssm.conv_kernel": cfg.linear_conv_kernel_dim, "ssm.state_size": cfg.linear_key_head_dim,
                     "ssm.group_count": cfg.linear_num_key_heads, "ssm.time_step_rank": cfg.linear_num_value_heads,
                     "ssm.inner_size": cfg.linear_value_head_dim * cfg.linear_num_value_heads,
                     "full_attention_interval": 4, "rope.dimension_count": cfg.head_dim // 4})
    rope = getattr(cfg, "rope_parameters", None) or {}
    rope = rope.get("full_attention", rope)  # (Gemma 3's global layers')
    floats["rope.freq_base"] = float(rope.get("rope_theta", 10000.0))
    for key, value in ints.items():
        writer.add_uint32(f"{arch}.{key}", value)
    for key, value in floats.items():
        writer.add_float32(f"{arch}.{key}", value)
    experts: dict[tuple[str, str], dict[int, np.ndarray]] = {}
    for name, tensor in state.items():
        w = tensor.numpy().astype(np.float32)
        if ".experts." in name:  # model.layers.L.<moe>.experts.E.proj.weight: stacked per layer and proj
            parts = name.split(".")
            experts.setdefault((parts[2], EXPERT_PROJ.get(parts[6], parts[6])), {})[int(parts[5])] = w
            continue
        if (arch.startswith("gemma") or arch == "qwen3next") and name.endswith("norm.weight") \
                and not name.endswith("linear_attn.norm.weight"):
            w = w + 1  # (llama.cpp's converter stores Gemma's and Qwen3-Next's 1 + w)
        if arch == "qwen3next" and ".linear_attn." in name and not name.endswith(
                ("in_proj_ba.weight", "norm.weight", "out_proj.weight")):
            _write_gdn(writer, name, w, cfg)
            continue
        if name.endswith("kv_b_proj.weight"):  # llama.cpp's split: k_b [H, rank, nope] and v_b [H, v, rank]
            kv_b = w.reshape(cfg.num_attention_heads, cfg.qk_nope_head_dim + cfg.v_head_dim, -1)
            layer = name.split(".")[2]
            writer.add_tensor(f"blk.{layer}.attn_k_b.weight",
                              np.ascontiguousarray(kv_b[:, :cfg.qk_nope_head_dim].transpose(0, 2, 1)))
            writer.add_tensor(f"blk.{layer}.attn_v_b.weight", np.ascontiguousarray(kv_b[:, cfg.qk_nope_head_dim:]))
            continue
        if arch == "llama" and "self_attn.q_proj" in name:
            w = _permute(w, cfg.num_attention_heads)
        if arch == "llama" and "self_attn.k_proj" in name:
            w = _permute(w, cfg.num_key_value_heads)
        writer.add_tensor(_gguf_name(name, arch), w.reshape(-1) if name.endswith("shared_expert_gate.weight") else w)
    for (layer, proj), by_expert in experts.items():
        writer.add_tensor(f"blk.{layer}.{_STACKS[proj]}", np.stack([by_expert[e] for e in sorted(by_expert)]))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def _write_gdn(writer, name, w, cfg):
    """A GDN layer's tensors as llama.cpp's qwen3next converter writes them."""
    layer = name.split(".")[2]
    if name.endswith("in_proj_qkvz.weight"):  # per key head [q, k, v, z] -> all q, all k, all v; and all z
        hk, dk = cfg.linear_num_key_heads, cfg.linear_key_head_dim
        per_k = cfg.linear_num_value_heads // hk * cfg.linear_value_head_dim
        grouped = w.reshape(hk, 2 * dk + 2 * per_k, -1)
        q, k, v, z = np.split(grouped, [dk, 2 * dk, 2 * dk + per_k], axis=1)
        writer.add_tensor(f"blk.{layer}.attn_qkv.weight",
                          np.ascontiguousarray(np.concatenate([x.reshape(-1, w.shape[-1]) for x in (q, k, v)])))
        writer.add_tensor(f"blk.{layer}.attn_gate.weight", np.ascontiguousarray(z.reshape(-1, w.shape[-1])))
    elif name.endswith("conv1d.weight"):
        writer.add_tensor(f"blk.{layer}.ssm_conv1d.weight", np.ascontiguousarray(w.squeeze(1)))
    elif name.endswith("dt_bias"):
        writer.add_tensor(f"blk.{layer}.ssm_dt.bias", w)
    elif name.endswith("A_log"):
        writer.add_tensor(f"blk.{layer}.ssm_a", -np.exp(w))
    else:
        raise AssertionError(name)


@pytest.mark.parametrize("family", sorted(SHAPES))
def test_a_gguf_file_loads_as_its_checkpoint(family, tmp_path):
    import transformers

    arch, shape = SHAPES[family]
    hf_dir = save_tiny_model(family.split("-")[0], tmp_path / "hf", seed=5, **shape)
    path = tmp_path / f"{family}.gguf"
    write_gguf(hf_dir, path, arch, transformers.AutoConfig.from_pretrained(hf_dir))
    from_gguf = load_model(str(path), "float32", skip_tokenizer=True)
    from_hf = load_model(str(hf_dir), "float32", skip_tokenizer=True)
    if arch != "llama":  # (llama.cpp's Mistral and Mixtral are Llamas, with experts: the family differs)
        # (the file keeps floats as float32: eps, and YaRN's mscales and the scale they give)
        ours, theirs = from_gguf.cfg, from_hf.cfg
        assert ours == dataclasses.replace(theirs, rms_norm_eps=ours.rms_norm_eps, query_scale=ours.query_scale,
                                           rope_scaling=ours.rope_scaling)
        assert ours.rms_norm_eps == pytest.approx(theirs.rms_norm_eps, rel=1e-6)
        assert ours.query_scale == (theirs.query_scale and pytest.approx(theirs.query_scale, rel=1e-6))
        for key, value in (ours.rope_scaling or {}).items():
            assert value == pytest.approx(theirs.rope_scaling[key], rel=1e-6) if key != "rope_type" else value == "yarn"
        for name in from_hf.model.checkpoint_layout():
            ours, theirs = from_gguf.model.checkpoint_tensor(name), from_hf.model.checkpoint_tensor(name)
            # (Gemma's norms: the file holds 1 + w, computed in fp32 both ways)
            if name.endswith("A_log"):  # (the file holds -exp(A_log): back through log, to an ulp)
                torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=1e-7)
            else:
                assert torch.equal(ours, theirs), name
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    prompt = {"prompt_token_ids": [5, 77, 3, 190, 41, 8, 300, 12]}
    outs = [LLM(str(p), skip_tokenizer_init=True, max_model_len=256, kv_cache_memory=8 << 20).generate(
        prompt, params, use_tqdm=False)[0].outputs[0].token_ids for p in (path, hf_dir)]
    assert outs[0] == outs[1] and len(outs[0]) == 12

"""Acceptance: tiny random Llama/Mistral/Qwen2/Qwen3/Phi-3/Gemma 2/Gemma 3 and Qwen3-MoE/Qwen2-MoE/Mixtral/OLMoE
logits equal transformers' through prefill and 16 decodes; the sliding windows (Mistral's, Phi-3's, Gemma's
alternating ones) are shorter than the prompts, so they slide."""
import pytest
import torch

from actorserve.runtime.resolve import engine_config
from actorserve.runtime.engine.sampling_params import SamplingParams
from actorserve.runtime.worker_assembly import build_engine
from tests.conftest import save_tiny_model

FAMILIES = {
    "llama": dict(rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
                  rope_theta=50000.0),
    "llama-yarn": dict(rope_parameters={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64,
                                        "rope_theta": 10000.0}),
    "qwen2": dict(tie_word_embeddings=True),
    "qwen3": dict(head_dim=32, attention_bias=False),
    "mistral": dict(sliding_window=None),
    "mistral-window": dict(sliding_window=12, head_dim=32),  # (the C kernel and the decode fast path)
    "phi3": dict(pad_token_id=None, tie_word_embeddings=True, sliding_window=20),
    # soft caps low enough to bite; query_pre_attn_scalar unlike head_dim; windows, a global layer between
    "gemma2": dict(head_dim=32, sliding_window=10, query_pre_attn_scalar=24, attn_logit_softcapping=1.5,
                   final_logit_softcapping=3.0, num_hidden_layers=3, tie_word_embeddings=True),
    "gemma3": dict(head_dim=32, sliding_window=9, query_pre_attn_scalar=40, num_hidden_layers=3,
                   layer_types=["sliding_attention", "full_attention", "sliding_attention"],
                   rope_parameters={"full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 100000.0},
                                    "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}),
    # mixture of experts: renormalised top-k or not, a dense layer between sparse ones, a shared expert
    "qwen3_moe": dict(head_dim=32, num_experts=6, num_experts_per_tok=2, moe_intermediate_size=48,
                      norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[1]),
    "qwen2_moe": dict(num_experts=5, num_experts_per_tok=2, moe_intermediate_size=40,
                      shared_expert_intermediate_size=72, norm_topk_prob=False, decoder_sparse_step=1,
                      mlp_only_layers=[]),
    "mixtral": dict(num_local_experts=4, num_experts_per_tok=2, sliding_window=None),
    "olmoe": dict(num_experts=5, num_experts_per_tok=2, norm_topk_prob=False, clip_qkv=3.0),
    # hybrid: gated delta nets (grouped value heads) around a gated full-attention layer with partial rotary;
    # MoE with a shared expert in one layer, dense MLPs in the others
    "qwen3_next": dict(num_hidden_layers=4, head_dim=32, linear_num_key_heads=2, linear_num_value_heads=4,
                       linear_key_head_dim=16, linear_value_head_dim=8, num_experts=4, num_experts_per_tok=2,
                       moe_intermediate_size=32, shared_expert_intermediate_size=48, mlp_only_layers=[0, 1, 3],
                       layer_types=["linear_attention", "full_attention", "linear_attention", "linear_attention"]),
    # multi-head latent attention: a latent of 48 + a rotary key of 16 (64 a token: the C kernel's head size);
    # with and without q's low rank; a dense first layer, then routed and shared experts, grouped routing
    "deepseek_v2": dict(num_hidden_layers=3, num_key_value_heads=4, kv_lora_rank=48, q_lora_rank=None,
                        qk_nope_head_dim=16, qk_rope_head_dim=16, v_head_dim=24, n_routed_experts=4,
                        num_experts_per_tok=2,
                        moe_intermediate_size=32, n_shared_experts=1, first_k_dense_replace=1),
    "deepseek_v2-qlora": dict(num_hidden_layers=3, num_key_value_heads=4, kv_lora_rank=32, q_lora_rank=40,
                              qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16, n_routed_experts=8,
                              num_experts_per_tok=2,
                              moe_intermediate_size=32, n_shared_experts=2, first_k_dense_replace=1,
                              topk_method="group_limited_greedy", n_group=4, topk_group=1,
                              routed_scaling_factor=1.5),
    # DeepSeek-V2-Lite's rope: YaRN with mscale and mscale_all_dim (the softmax scale takes mscale too)
    "deepseek_v2-yarn": dict(num_hidden_layers=2, num_key_value_heads=4, kv_lora_rank=48, q_lora_rank=None,
                             qk_nope_head_dim=16, qk_rope_head_dim=16, v_head_dim=24, n_routed_experts=4,
                             num_experts_per_tok=2, moe_intermediate_size=32, n_shared_experts=1,
                             first_k_dense_replace=1,
                             rope_parameters={"rope_type": "yarn", "factor": 40.0, "mscale": 0.707,
                                              "original_max_position_embeddings": 32, "mscale_all_dim": 0.707,
                                              "beta_fast": 32, "beta_slow": 1, "rope_theta": 10000.0}),
}
PROMPT_LENS = (5, 17, 33, 2, 48)
DECODE_STEPS = 16


class RecordingExecutor:
    """Wraps the runner and keeps every sampled row's logits, keyed by request and position."""

    def __init__(self, runner):
        self.runner = runner
        self.logits: dict[str, list[torch.Tensor]] = {}

    def execute(self, batch):
        self.runner._update_states(batch)
        inputs = self.runner.prepare_inputs(batch)
        logits = self.runner.forward(inputs)
        for rid, row in zip(inputs.sample_ids, logits):
            self.logits.setdefault(rid, []).append(row.clone())
        tokens = logits.argmax(dim=-1).tolist()
        for rid, tok in zip(inputs.sample_ids, tokens):
            self.runner._rows[rid].output_ids.append(tok)
        from actorserve.runtime.transport.messages import ModelRunnerOutput
        return ModelRunnerOutput(batch.step, {rid: [t] for rid, t in zip(inputs.sample_ids, tokens)}, {})


# fp32 on both sides; on a GPU the products are cuBLAS's (TF32 off, torch's default) and attention triton's
TOLERANCE = {"cpu": 1e-4, "cuda": 1e-3}


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
@pytest.mark.parametrize("budget", [4096, 24], ids=["whole-prefill", "chunked-prefill"])
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_logits_match_transformers(family, budget, device, tmp_path):
    """On the CPU, and on a GPU against transformers on the same GPU (scripts/gpu_check.sh)."""
    import transformers

    directory = save_tiny_model(family.split("-")[0], tmp_path / family, seed=1, **FAMILIES[family])
    config = engine_config(str(directory), skip_tokenizer_init=True, kv_cache_memory=8 << 20,
                           max_model_len=256, max_num_batched_tokens=budget, device=device)
    engine, loaded = build_engine(config)
    recorder = RecordingExecutor(engine.executor)
    engine.executor = recorder
    gen = torch.Generator().manual_seed(7)
    prompts = [torch.randint(0, 384, (n,), generator=gen).tolist() for n in PROMPT_LENS]
    params = SamplingParams(temperature=0.0, max_tokens=DECODE_STEPS + 1, ignore_eos=True)
    for i, ids in enumerate(prompts):
        engine.add_request(f"r{i}", ids, params)
    outputs = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            outputs[out.request_id] = out

    reference = transformers.AutoModelForCausalLM.from_pretrained(directory, torch_dtype=torch.float32).eval()
    reference.to(device)
    for i, ids in enumerate(prompts):
        generated = outputs[f"r{i}"].outputs[0].token_ids
        assert len(generated) == DECODE_STEPS + 1
        full = torch.tensor([ids + generated[:-1]], device=device)
        with torch.no_grad():
            expected = reference(full).logits[0, len(ids) - 1:].cpu()
        ours = torch.stack(recorder.logits[f"r{i}"]).cpu()
        assert ours.shape == expected.shape
        diff = (ours - expected).abs().max().item()
        assert diff < TOLERANCE[device], f"{family} prompt {i}: max abs diff {diff}"

"""A hybrid model (Qwen3-Next: gated delta nets around full attention, MoE): its GDN layer keeps the gates
and the recurrent state in fp32 in a bf16 model; the KV manager hands out and takes back state slots with
the blocks; and the 200-prompt stress set with preemption gives the tokens it gives with room for
everything, leaving every block and every slot free."""
import random

import pytest
import torch

from actorserve import LLM, SamplingParams
from actorserve.kernels.linear_attention import gated_delta
from actorserve.runtime.engine.kv_cache_manager import KVCacheManager
from actorserve.runtime.engine.request import Request
from actorserve.runtime.model.weights.hf_weights import read_config
from actorserve.runtime.model.architectures.linear_attention import GatedDeltaNet, LinearLayerState, LinearStep
from tests.conftest import save_tiny_model

SHAPE = dict(num_hidden_layers=4, head_dim=32, linear_num_key_heads=2, linear_num_value_heads=4,
             linear_key_head_dim=16, linear_value_head_dim=8, num_experts=4, num_experts_per_tok=2,
             moe_intermediate_size=32, shared_expert_intermediate_size=48, mlp_only_layers=[0, 1],
             tie_word_embeddings=True)


def test_the_gates_and_the_state_are_fp32_in_a_bf16_model(tmp_path, monkeypatch):
    cfg = read_config(str(save_tiny_model("qwen3_next", tmp_path / "m", **SHAPE)))
    layer = GatedDeltaNet(cfg)
    for p in layer.parameters():
        torch.nn.init.normal_(p, 0.0, 0.1)
    layer = layer.to(torch.bfloat16)
    state = LinearLayerState.zeros(cfg, 3, torch.bfloat16, torch.device("cpu"))
    assert state.recurrent.dtype == torch.float32 and state.conv.dtype == torch.bfloat16
    seen = []
    for name in ("recurrent_step", "chunked_varlen"):
        real = getattr(gated_delta, name)

        def spy(q, k, v, g, beta, *rest, real=real):
            seen.append((g.dtype, beta.dtype))
            return real(q, k, v, g, beta, *rest)
        monkeypatch.setattr(gated_delta, name, spy)
    x = torch.randn(7, cfg.hidden_size, dtype=torch.bfloat16)
    step = LinearStep(1, torch.tensor([2]), torch.tensor([False]), [0, 6], [0], [True])
    out = layer(x, state, step)
    assert out.dtype == torch.bfloat16 and torch.isfinite(out.float()).all()
    assert seen == [(torch.float32, torch.float32)] * 2
    assert state.recurrent[0].abs().sum() > 0 and state.recurrent[1].abs().sum() == 0


def _req(rid, n):
    return Request(rid, list(range(n)), SamplingParams(), 0, 10_000)


def _free_state_slots(kv: KVCacheManager) -> int:
    """How many more requests get a state slot: one-token probes allocated until one is refused, then freed."""
    probes = []
    while True:
        probe = _req(f"probe{len(probes)}", 1)
        if not kv.allocate(probe, 1):
            break
        probes.append(probe)
    for probe in probes:
        kv.free(probe)
    return len(probes)


def test_state_slots_come_and_go_with_the_blocks():
    kv = KVCacheManager(num_blocks=8, block_size=4, enable_caching=False, num_state_slots=2)
    a, b, c = _req("a", 5), _req("b", 5), _req("c", 5)
    assert kv.allocate(a, 5) and kv.allocate(b, 5)
    assert {kv.state_slot("a"), kv.state_slot("b")} == {0, 1} and _free_state_slots(kv) == 0
    free_blocks = kv.pool.num_free_blocks
    assert not kv.allocate(c, 5)  # blocks enough, but no slot: nothing taken
    assert kv.pool.num_free_blocks == free_blocks and kv.state_slot("c") == -1
    slot = kv.state_slot("a")
    assert kv.allocate(a, 1) and kv.state_slot("a") == slot  # more room keeps the slot
    kv.free(a)  # finished, or preempted
    assert kv.allocate(c, 5) and kv.state_slot("c") == slot
    kv.free(b)
    kv.free(c)
    assert kv.pool.num_free_blocks == 8 and _free_state_slots(kv) == 2


def test_the_stress_set_on_a_hybrid_model_with_preemption(tmp_path):
    directory = save_tiny_model("qwen3_next", tmp_path / "next", seed=3, **SHAPE)
    rng = random.Random(4)
    prompts, params = [], []
    for _ in range(200):
        n = rng.randint(1, 300)
        prompts.append({"prompt_token_ids": [rng.randrange(384) for _ in range(n)]})
        params.append(SamplingParams(temperature=0.0, max_tokens=rng.randint(1, 48), ignore_eos=True))
    args = dict(skip_tokenizer_init=True, max_model_len=400, max_num_batched_tokens=256, disable_log_stats=True,
                max_num_seqs=16)
    roomy = LLM(str(directory), kv_cache_memory=8 << 20, **args)
    expected = [o.outputs[0].token_ids for o in roomy.generate(prompts, params, use_tqdm=False)]
    # 16 state slots of the three GDN layers, and K and V of the one full-attention layer: 30 blocks of 16
    # tokens, 2 KV heads of 32, fp32
    states = 16 * 3 * LinearLayerState.bytes_per_slot(read_config(str(directory)), torch.float32)
    tight = LLM(str(directory), kv_cache_memory=states + 30 * 16 * 2 * 2 * 32 * 4, **args)
    got = [o.outputs[0].token_ids for o in tight.generate(prompts, params, use_tqdm=False)]
    assert got == expected
    engine = tight.engine
    assert engine.facts.num_kv_blocks == 30 and engine.facts.num_state_slots == 16
    assert engine.scheduler.num_preemptions > 0 and engine.kv.pool.hits == 0
    assert engine.num_free_blocks == engine.facts.num_kv_blocks
    assert _free_state_slots(engine.kv) == engine.facts.num_state_slots


def test_state_slots_that_do_not_fit_the_budget_are_a_clear_error(tmp_path):
    directory = save_tiny_model("qwen3_next", tmp_path / "next", **SHAPE)
    with pytest.raises(ValueError, match="recurrent states of 256 sequences take .* lower max_num_seqs"):
        LLM(str(directory), skip_tokenizer_init=True, max_model_len=256, kv_cache_memory=1 << 20)


def test_speculative_decoding_is_refused_for_a_hybrid_model(tmp_path):
    directory = save_tiny_model("qwen3_next", tmp_path / "next", **SHAPE)
    with pytest.raises(ValueError, match="linear-attention layers"):
        LLM(str(directory), skip_tokenizer_init=True, max_model_len=256, kv_cache_memory=8 << 20,
            speculative_config={"method": "ngram", "num_speculative_tokens": 2})


def test_a_model_of_linear_layers_only_serves(tmp_path):
    """No softmax attention at all: no key is kept, so the blocks cost nothing, and generation works."""
    directory = save_tiny_model("qwen3_next", tmp_path / "next", **dict(SHAPE, num_hidden_layers=2,
                                                                        mlp_only_layers=[0, 1]))
    llm = LLM(str(directory), skip_tokenizer_init=True, max_model_len=256, kv_cache_memory=8 << 20,
              max_num_seqs=4)
    assert llm.engine.facts.num_kv_blocks == 4 * 256 // 16
    out = llm.generate({"prompt_token_ids": list(range(40))}, SamplingParams(temperature=0, max_tokens=8,
                                                                               ignore_eos=True), use_tqdm=False)
    assert len(out[0].outputs[0].token_ids) == 8


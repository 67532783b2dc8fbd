"""The sparse MoE MLP: its grouped products against a per-token reference (renormalised or not, with a
shared expert), the router's fast-kernel gate condition by condition, and the 200-prompt stress set on a
tiny Qwen3-MoE with preemption and prefix caching, leaving the cache free."""
import random

import pytest
import torch
from torch.nn import functional as F

from actorserve import LLM, SamplingParams
from actorserve.kernels.gemm import skinny
from actorserve.runtime.model.architectures import moe as moe_module
from actorserve.runtime.model.architectures.moe import RouterGate, SparseMoE
from tests.conftest import save_tiny_model


def _random_moe(renormalize, shared, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    m = SparseMoE(32, 24, 6, 2, renormalize, shared_inter=40 if shared else 0)
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.2)
    return m.to(dtype)


def _per_token(m: SparseMoE, x):
    """The same MoE, one token and one chosen expert at a time."""
    out = torch.zeros_like(x)
    probs = F.linear(x, m.gate.weight).float().softmax(-1)
    for t in range(x.shape[0]):
        w, e = probs[t].topk(m.top_k)
        if m.renormalize:
            w = w / w.sum()
        for weight, expert in zip(w.to(x.dtype), e.tolist()):
            gate_up = m.experts_gate_up[expert * 48:(expert + 1) * 48]
            h = F.silu(x[t] @ gate_up[:24].T) * (x[t] @ gate_up[24:].T)
            out[t] += weight * (h @ m.experts_down[expert * 32:(expert + 1) * 32].T)
        if m.shared_expert is not None:
            out[t] += torch.sigmoid(x[t] @ m.shared_expert_gate.weight.T) * m.shared_expert(x[t:t + 1])[0]
    return out


@pytest.mark.parametrize("renormalize, shared", [(True, False), (False, False), (False, True)])
def test_grouped_experts_equal_the_per_token_reference(renormalize, shared):
    m = _random_moe(renormalize, shared)
    x = torch.randn(11, 32, generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(m(x), _per_token(m, x), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype, device, kernel, rows, fast", [
    (torch.bfloat16, "cpu", True, 1, True),
    (torch.bfloat16, "cpu", True, skinny.MAX_ROWS, True),
    (torch.float32, "cpu", True, 1, False),  # each condition alone
    (torch.float16, "cpu", True, 1, False),
    (torch.bfloat16, "cuda", True, 1, False),
    (torch.bfloat16, "cpu", False, 1, False),
    (torch.bfloat16, "cpu", True, skinny.MAX_ROWS + 1, False),
    (torch.bfloat16, "cpu", True, 0, False),
])
def test_the_router_takes_its_fast_kernel_only_where_every_condition_holds(dtype, device, kernel, rows, fast):
    assert RouterGate.for_model(dtype, torch.device(device), kernel_available=kernel).takes(rows) is fast


@pytest.mark.skipif(not skinny.available(), reason="needs the skinny bf16 C kernel")
def test_a_bf16_decode_routes_through_the_fast_kernel_and_agrees(monkeypatch):
    m = _random_moe(True, False, torch.bfloat16)
    m.decide_router()
    calls = []
    real = skinny.skinny_linear
    monkeypatch.setattr(moe_module.skinny, "skinny_linear", lambda *a: calls.append(a[0].shape[0]) or real(*a))
    x = torch.randn(3, 32, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)
    fast = m.router_logits(x)
    m.router_logits(torch.randn(20, 32).to(torch.bfloat16))  # a prefill: the plain product
    assert calls == [3]
    torch.testing.assert_close(fast.float(), F.linear(x, m.gate.weight).float(), atol=2e-2, rtol=2e-2)
    m32 = _random_moe(True, False)
    m32.decide_router()
    assert not m32.router_gate.takes(1)


def test_the_stress_set_on_a_moe_model_with_preemption_and_prefix_caching(tmp_path):
    directory = save_tiny_model("qwen3_moe", tmp_path / "moe", seed=3, head_dim=32, num_experts=6,
                                num_experts_per_tok=2, moe_intermediate_size=48, norm_topk_prob=True,
                                decoder_sparse_step=1, mlp_only_layers=[], tie_word_embeddings=True)
    rng = random.Random(4)
    shared = [rng.randrange(384) for _ in range(48)]
    prompts, params = [], []
    for i in range(200):
        n = rng.randint(1, 300)
        body = [rng.randrange(384) for _ in range(n)]
        prompts.append({"prompt_token_ids": (shared + body)[:n] if i % 2 == 0 else body})
        params.append(SamplingParams(temperature=0.0, max_tokens=rng.randint(1, 48), ignore_eos=True))
    args = dict(skip_tokenizer_init=True, max_model_len=400, max_num_batched_tokens=256, disable_log_stats=True)
    roomy = LLM(str(directory), kv_cache_memory=8 << 20, **args)
    expected = [o.outputs[0].token_ids for o in roomy.generate(prompts, params, use_tqdm=False)]
    tight = LLM(str(directory), kv_cache_memory=30 * 16 * 2 * 2 * 2 * 32 * 4, **args)
    got = [o.outputs[0].token_ids for o in tight.generate(prompts, params, use_tqdm=False)]
    assert got == expected
    engine = tight.engine
    assert engine.scheduler.num_preemptions > 0 and engine.kv.pool.hits > 0
    assert engine.num_free_blocks == engine.facts.num_kv_blocks

"""Acceptance: many mixed requests under a KV budget that forces preemption, with shared prefixes."""
import random

import pytest

from actorserve import LLM, SamplingParams


def _workload(rng, count, vocab, shared_len=48, max_len=400):
    shared = [rng.randrange(vocab) for _ in range(shared_len)]
    prompts, params = [], []
    for i in range(count):
        n = rng.randint(1, max_len)
        body = [rng.randrange(vocab) for _ in range(n)]
        prompts.append((shared + body)[:n] if i % 2 == 0 else body)
        params.append(SamplingParams(temperature=0.0, max_tokens=rng.randint(1, 64), ignore_eos=True))
    return prompts, params


def _check_against_alone(llm, prompts, params):
    together = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    engine = llm.engine
    assert engine.scheduler.num_preemptions > 0, "the budget was meant to force preemption"
    assert engine.kv.pool.hits > 0
    assert engine.num_free_blocks == engine.kv.pool.num_blocks
    assert all(o.finished for o in together)
    for prompt, sp, out in zip(prompts, params, together):
        alone = llm.generate({"prompt_token_ids": prompt}, sp, use_tqdm=False)[0]
        assert len(out.outputs[0].token_ids) == sp.max_tokens
        assert out.outputs[0].token_ids == alone.outputs[0].token_ids
    assert engine.num_free_blocks == engine.kv.pool.num_blocks


def test_stress_200_prompts_tiny_model(tiny_llama_dir):
    # 48 blocks of 16 tokens: room for about two long requests at once.
    llm = LLM(str(tiny_llama_dir), skip_tokenizer_init=True, kv_cache_memory=48 * 8192, max_model_len=512,
              max_num_batched_tokens=256)
    prompts, params = _workload(random.Random(0), 200, vocab=384)
    _check_against_alone(llm, prompts, params)


@pytest.mark.slow
def test_stress_default_model_small_budget():
    llm = LLM(kv_cache_memory=40 * 737280, max_model_len=640, max_num_batched_tokens=256)
    prompts, params = _workload(random.Random(1), 12, vocab=llm.vocab_size, shared_len=64, max_len=300)
    params = [SamplingParams(temperature=0.0, max_tokens=min(p.max_tokens, 24), ignore_eos=True) for p in params]
    _check_against_alone(llm, prompts, params)

"""Prompt logprobs through ``LLM``: against a transformers forward pass over the file's own weights, and
the same whether the prompt is computed in one chunk or many, after the prefix cache holds it, with n
samples, or after a preemption."""
import pytest
import torch

from actorserve import LLM, SamplingParams

PROMPT = "The capital of France is Paris. The capital of Germany is Berlin. The capital of Italy is"


def hf_prompt_logprobs(model, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float().log_softmax(-1)


def values(out) -> list[float]:
    ids = out.prompt_token_ids
    return [out.prompt_logprobs[i][ids[i]].logprob for i in range(1, len(ids))]


def test_prompt_logprobs_match_a_transformers_forward_pass(smollm, hf_smollm):
    out = smollm.generate(PROMPT, SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=3), use_tqdm=False)[0]
    ids = out.prompt_token_ids
    assert len(out.prompt_logprobs) == len(ids) and out.prompt_logprobs[0] is None
    ref = hf_prompt_logprobs(hf_smollm, ids)
    for i in range(1, len(ids)):
        entry = out.prompt_logprobs[i]
        row = ref[i - 1]
        assert entry[ids[i]].logprob == pytest.approx(row[ids[i]].item(), abs=1e-4)
        value = row[ids[i]]  # the rank counts the likelier tokens; a near-tie may tip either way
        assert int((row > value + 1e-4).sum()) < entry[ids[i]].rank <= int((row > value - 1e-4).sum()) + 1
        assert entry[ids[i]].decoded_token == smollm.get_tokenizer().decode([ids[i]])
        top = [t for t in entry if t != ids[i]] + ([ids[i]] if entry[ids[i]].rank <= 3 else [])
        assert sorted(entry[t].rank for t in top) == [1, 2, 3]
        assert set(top) == set(row.topk(3).indices.tolist())


def test_chunked_prefill_and_the_prefix_cache_give_the_same_numbers():
    params = SamplingParams(temperature=0, max_tokens=2, prompt_logprobs=2)
    whole = LLM(kv_cache_memory=128 << 20, max_model_len=2048, enable_prefix_caching=False)
    reference = whole.generate(PROMPT, params, use_tqdm=False)[0]

    chunked = LLM(kv_cache_memory=128 << 20, max_model_len=2048, max_num_batched_tokens=5)
    out = chunked.generate(PROMPT, params, use_tqdm=False)[0]
    assert values(out) == pytest.approx(values(reference), abs=1e-4)
    assert out.outputs[0].token_ids == reference.outputs[0].token_ids

    cached = LLM(kv_cache_memory=128 << 20, max_model_len=2048)
    warm = cached.generate(PROMPT, SamplingParams(temperature=0, max_tokens=2), use_tqdm=False)[0]
    assert warm.prompt_logprobs is None
    again = cached.generate(PROMPT, params, use_tqdm=False)[0]
    assert again.num_cached_tokens == 0  # computed, not read from the cache: its logprobs need the rows
    assert values(again) == values(reference)
    plain = cached.generate(PROMPT, SamplingParams(temperature=0, max_tokens=2), use_tqdm=False)[0]
    assert plain.num_cached_tokens > 0  # the cache still serves requests that do not ask


def test_n_samples_share_one_set_and_a_preempted_request_keeps_it():
    reference = LLM(kv_cache_memory=128 << 20, max_model_len=2048, enable_prefix_caching=False).generate(
        PROMPT, SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=1), use_tqdm=False)[0]
    # 12 blocks of 16 tokens for four requests of ~22 + 40 tokens: some are preempted and recomputed
    small = LLM(kv_cache_memory=12 * 2 * 30 * 16 * 3 * 64 * 4, max_model_len=128, max_num_seqs=4)
    params = SamplingParams(temperature=1.0, seed=3, max_tokens=40, ignore_eos=True, n=2, prompt_logprobs=1)
    outs = small.generate([PROMPT] * 2, params, use_tqdm=False)
    assert small.engine.scheduler.num_preemptions > 0
    for out in outs:
        assert values(out) == pytest.approx(values(reference), abs=1e-4)
        assert all(len(o.token_ids) == 40 for o in out.outputs)

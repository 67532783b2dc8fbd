"""Speculative decoding with a draft model, through the embedded engine on tiny random models and on the
default model: the target's greedy tokens exactly; every draft kept where a model drafts for itself (so
the draft's own KV cache follows the target's through chunked prefill, prefix caching and preemption);
sampled tokens distributed as without speculation (chi-square); a seeded request independent of its
batch; the draft's noise a stream of its own."""
import random

import pytest
import torch

from actorserve import LLM, SamplingParams
from actorserve.runtime.config import SpeculativeConfig
from actorserve.runtime.resolve import engine_config
from actorserve.runtime.model.sampling.sampler import noise_stream, stream_seed
from tests.conftest import save_tiny_model
from tests.runtime.model.sampling.test_rejection_sampler import chi_square_tail


def spec(model, k=3):
    return {"method": "draft_model", "model": str(model), "num_speculative_tokens": k}


def llm(model, draft=None, k=3, **kw):
    kw = {"skip_tokenizer_init": True, "kv_cache_memory": 1 << 20, "max_model_len": 512,
          "disable_log_stats": True, **kw}
    return LLM(str(model), speculative_config=None if draft is None else spec(draft, k), **kw)


def stats(engine: LLM):
    return engine.engine.scheduler.spec_stats


def token_ids(outputs):
    return [o.outputs[0].token_ids for o in outputs]


@pytest.fixture(scope="module")
def tiny_draft_dir(tmp_path_factory):
    """Another tiny Llama with the target's vocabulary: its drafts are right only some of the time."""
    return save_tiny_model("llama", tmp_path_factory.mktemp("tiny-draft"), seed=1, tie_word_embeddings=True,
                           num_hidden_layers=1)


def _prompts(n, seed=0, shared=None):
    rng = random.Random(seed)
    out = []
    for i in range(n):
        prompt = [rng.randrange(384) for _ in range(rng.randint(2, 120))]
        if shared is not None and i % 3 == 0:
            prompt = shared + prompt
        out.append({"prompt_token_ids": prompt})
    return out


def test_the_config_takes_a_draft_model_as_vllm_spells_it(tiny_llama_dir):
    c = SpeculativeConfig.parse({"model": "/some/draft.gguf", "num_speculative_tokens": 2})
    assert (c.method, c.model, c.num_speculative_tokens) == ("draft_model", "/some/draft.gguf", 2)
    for bad, why in [({"method": "draft_model", "num_speculative_tokens": 2}, "needs a model"),
                     ({"method": "ngram", "num_speculative_tokens": 2, "model": "x"}, "for method draft_model")]:
        with pytest.raises(ValueError, match=why):
            SpeculativeConfig.parse(bad)
    with pytest.raises(ValueError, match="speculative_config quantization must be one of"):  # the registry's name
        engine_config(str(tiny_llama_dir), speculative_config={"model": "x", "num_speculative_tokens": 2,
                                                               "quantization": "nope"})
    with pytest.raises(ValueError, match="pipeline_parallel_size 1"):
        engine_config(str(tiny_llama_dir), pipeline_parallel_size=2, speculative_config=spec(tiny_llama_dir))


def test_a_draft_with_another_vocabulary_is_refused(tiny_llama_dir, tmp_path):
    other = save_tiny_model("llama", tmp_path / "other", vocab_size=400, tie_word_embeddings=True)
    with pytest.raises(ValueError, match="vocabulary of 400 tokens"):
        llm(tiny_llama_dir, other)


def test_a_tiny_draft_gives_the_targets_greedy_tokens(tiny_llama_dir, tiny_draft_dir):
    prompts = _prompts(12)
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    plain = token_ids(llm(tiny_llama_dir).generate(prompts, params, use_tqdm=False))
    drafted = llm(tiny_llama_dir, tiny_draft_dir, k=4)
    assert token_ids(drafted.generate(prompts, params, use_tqdm=False)) == plain
    s = stats(drafted)
    assert 0 < s.num_accepted_tokens < s.num_draft_tokens  # some drafts kept, some not
    assert drafted.engine.num_free_blocks == drafted.engine.facts.num_kv_blocks


def test_a_model_drafting_for_itself_keeps_every_draft_through_preemption_and_prefix_caching(tiny_llama_dir):
    """The draft's cache must hold exactly what the target's does for its argmax to agree every time: this
    runs over chunked prompts (a small step budget), shared prefixes (cache hits) and a cache too small for
    the batch (preemptions)."""
    rng = random.Random(1)
    prompts = _prompts(40, seed=2, shared=[rng.randrange(384) for _ in range(70)])
    params = [SamplingParams(temperature=0, max_tokens=rng.randint(1, 48), ignore_eos=True) for _ in prompts]
    kw = dict(kv_cache_memory=20 * 16384, max_num_batched_tokens=64, max_model_len=256)  # 20 blocks with a draft
    plain = token_ids(llm(tiny_llama_dir, **kw).generate(prompts, params, use_tqdm=False))
    drafted = llm(tiny_llama_dir, tiny_llama_dir, k=3, **kw)
    assert token_ids(drafted.generate(prompts, params, use_tqdm=False)) == plain
    engine = drafted.engine
    assert engine.scheduler.num_preemptions > 0 and engine.kv.pool.hits > 0
    s = stats(drafted)
    assert s.num_draft_tokens > 200 and s.num_accepted_tokens == s.num_draft_tokens
    assert engine.num_free_blocks == engine.facts.num_kv_blocks


def test_the_default_model_drafting_for_itself_keeps_every_draft(greedy_reference):
    from actorserve.runtime.model_files import resolve_model_path

    ref = greedy_reference["prompts"][1]
    engine = LLM(kv_cache_memory=96 << 20, max_model_len=512, disable_log_stats=True,
                 speculative_config=spec(resolve_model_path(None), 3))
    out = engine.generate({"prompt_token_ids": ref["prompt_ids"]},
                          SamplingParams(temperature=0, max_tokens=len(ref["output_ids"])), use_tqdm=False)
    assert out[0].outputs[0].token_ids == ref["output_ids"]
    sampled = SamplingParams(temperature=0.8, max_tokens=32, seed=5, ignore_eos=True)
    engine.generate({"prompt_token_ids": ref["prompt_ids"]}, sampled, use_tqdm=False)
    s = stats(engine)
    assert s.num_draft_tokens > 20 and s.num_accepted_tokens == s.num_draft_tokens  # q = p: min(1, p/q) = 1
    # a request with a grammar is not drafted for (the scheduler checks drafts against it), and keeps to it
    drafted = s.num_draft_tokens
    choice = SamplingParams(temperature=0.7, max_tokens=8, seed=1,
                            structured_outputs={"choice": ["the ocean", "a mountain"]})
    out = engine.generate("Where do whales live?", choice, use_tqdm=False)[0].outputs[0]
    assert out.text in ("the ocean", "a mountain") and stats(engine).num_draft_tokens == drafted


def _homogeneity_p(a: torch.Tensor, b: torch.Tensor) -> float:
    """The p-value of a two-sample chi-square test that counts a and b come from one distribution."""
    keep = (a + b) > 0
    a, b = a[keep].double(), b[keep].double()
    na, nb = a.sum(), b.sum()
    total = a + b
    stat = float((((a - total * na / (na + nb)) ** 2) / (total * na / (na + nb))).sum()
                 + (((b - total * nb / (na + nb)) ** 2) / (total * nb / (na + nb))).sum())
    return chi_square_tail(stat, int(keep.sum()) - 1)


@pytest.fixture(scope="module")
def small_vocab(tmp_path_factory):
    """A target and a draft over 12 tokens, the draft a different model: q differs from p."""
    root = tmp_path_factory.mktemp("small-vocab")
    target = save_tiny_model("llama", root / "target", seed=3, vocab_size=12, tie_word_embeddings=True)
    draft = save_tiny_model("llama", root / "draft", seed=4, vocab_size=12, tie_word_embeddings=True,
                            num_hidden_layers=1)
    return target, draft


def _counts(engine, n, positions):
    prompt = {"prompt_token_ids": [1, 5, 7, 2]}
    outs = engine.generate([prompt] * n, SamplingParams(temperature=1.0, max_tokens=4, ignore_eos=True),
                           use_tqdm=False)
    return [torch.bincount(torch.tensor([o.outputs[0].token_ids[p] for o in outs]), minlength=12)
            for p in positions]


def test_sampled_tokens_follow_the_targets_distribution(small_vocab):
    """Of 4 tokens, token 0 comes from the prompt's step, tokens 1 and 2 from drafts (kept, or the residual
    where not) and token 3 from the bonus row or a residual: their frequencies with a draft model match
    those without (p > 0.001)."""
    target, draft = small_vocab
    n, positions = 6000, [1, 2, 3]
    plain = _counts(llm(target, max_num_seqs=256, seed=1), n, positions)
    drafted_engine = llm(target, draft, k=3, max_num_seqs=256, seed=2)
    drafted = _counts(drafted_engine, n, positions)
    s = stats(drafted_engine)
    assert 0.1 * s.num_draft_tokens < s.num_accepted_tokens < 0.9 * s.num_draft_tokens
    for a, b in zip(plain, drafted):
        assert _homogeneity_p(a, b) > 1e-3, (a.tolist(), b.tolist())


def test_keeping_every_draft_fails_the_chi_square(small_vocab, monkeypatch):
    """The test above can fail: a verifier that keeps every draft gives the draft's distribution at the
    drafted positions. (Keeping a draft with p(d) alone, as if q were one-hot, would pass: with the residual
    p without d that is exact too, for any q; min(1, p(d) / q(d)) only keeps more.)"""
    from actorserve.runtime.model.sampling.sampler import Sampler

    target, draft = small_vocab
    plain = _counts(llm(target, max_num_seqs=256, seed=1), 6000, [1])
    monkeypatch.setattr(Sampler, "uniform", lambda self, generator: 0.0)
    wrong = _counts(llm(target, draft, k=3, max_num_seqs=256, seed=2), 6000, [1])
    assert _homogeneity_p(plain[0], wrong[0]) < 1e-3


def test_a_seeded_request_does_not_depend_on_its_batch(tiny_llama_dir, tiny_draft_dir):
    engine = llm(tiny_llama_dir, tiny_draft_dir, k=3)
    seeded = SamplingParams(temperature=1.0, top_p=0.9, max_tokens=32, seed=42, ignore_eos=True)
    prompt = {"prompt_token_ids": [5, 6, 7, 8, 9]}
    alone = engine.generate(prompt, seeded, use_tqdm=False)[0].outputs[0].token_ids
    others = _prompts(7, seed=5)
    noise = SamplingParams(temperature=1.0, max_tokens=40, ignore_eos=True)
    batch = engine.generate(others[:3] + [prompt] + others[3:], [noise] * 3 + [seeded] + [noise] * 4,
                            use_tqdm=False)
    assert batch[3].outputs[0].token_ids == alone


def test_the_draft_and_the_target_draw_from_separate_streams(tiny_llama_dir, tiny_draft_dir, monkeypatch):
    """Salted by role from the request's seed: the two never draw the same noise. Were both seeded by the
    seed alone, each draw below would be the other's."""
    for seed in (0, 1, 42, 2**63):
        assert stream_seed(seed, "draft") != stream_seed(seed, "target")
        draft = torch.empty(4096).exponential_(generator=noise_stream(seed, "draft"))
        target = torch.empty(4096).exponential_(generator=noise_stream(seed, "target"))
        assert abs(float(torch.corrcoef(torch.stack([draft, target]))[0, 1])) < 0.1
    # and the engine's two roles make their streams so for a seeded request
    from actorserve.runtime.model.execution import draft_proposer, runner

    made = []

    def recording(seed, role, device="cpu"):
        made.append((seed, role))
        return noise_stream(seed, role, device)
    engine = llm(tiny_llama_dir, tiny_draft_dir, k=2)
    for module in (runner, draft_proposer):
        monkeypatch.setattr(module, "noise_stream", recording)
    engine.generate({"prompt_token_ids": [3, 4]}, SamplingParams(temperature=1.0, max_tokens=8, seed=9,
                                                                  ignore_eos=True), use_tqdm=False)
    assert sorted(made) == [(9, "draft"), (9, "target")]

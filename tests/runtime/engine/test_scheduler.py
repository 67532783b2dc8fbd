"""Scheduling policy on a fake executor: chunked prefill, limits, preemption, abort, n>1 prefix sharing."""
import random

import pytest

from actorserve.runtime.config import CacheConfig, EngineConfig, SchedulerConfig
from actorserve.runtime.engine.core import EngineCore, ModelFacts
from actorserve.runtime.engine.sampling_params import SamplingParams
from tests.runtime.engine.fake_executor import FakeExecutor, OracleProposer, next_token

VOCAB = 1000
BS = 16


def make_engine(num_blocks=256, max_num_seqs=64, budget=256, max_model_len=1024, chunked=True, spec_k=None,
                seed=0):
    """``spec_k``: speculative decoding on, with drafts of up to spec_k tokens from ``OracleProposer``."""
    spec = None if spec_k is None else {"method": "ngram", "num_speculative_tokens": spec_k}
    config = EngineConfig(cache=CacheConfig(block_size=BS),
                          scheduler=SchedulerConfig(max_num_seqs, budget, chunked, speculative_config=spec))
    facts = ModelFacts(vocab_size=VOCAB, eos_token_id=None, max_model_len=max_model_len, num_kv_blocks=num_blocks)
    executor = FakeExecutor(BS, VOCAB)
    engine = EngineCore(config, executor, facts)
    if spec_k is not None:
        engine.scheduler.proposer = OracleProposer(spec_k, random.Random(seed), VOCAB)
    return engine, executor


def run(engine):
    outs = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                outs[out.request_id] = out
    return outs


def expected(prompt, n):
    tokens = list(prompt)
    for _ in range(n):
        tokens.append(next_token(tokens, VOCAB))
    return tokens[len(prompt):]


def test_chunked_prefill_respects_the_token_budget():
    engine, ex = make_engine(budget=32)
    prompt = list(range(100))
    engine.add_request("a", prompt, SamplingParams(max_tokens=3))
    out = run(engine)["a"]
    assert out.outputs[0].token_ids == expected(prompt, 3)
    assert ex.max_batch_tokens <= 32
    assert ex.steps == 4 + 2  # ceil(100 / 32) prefill chunks, then two decodes


def test_max_num_seqs_bounds_the_batch():
    engine, ex = make_engine(max_num_seqs=3)
    for i in range(7):
        engine.add_request(str(i), [i + 1] * 5, SamplingParams(max_tokens=4))
    seen = []
    while engine.has_unfinished_requests():
        engine.step()
        seen.append(len(engine.scheduler.running))
    assert max(seen) == 3


@pytest.mark.parametrize("spec_k", [None, 4])  # and with speculative decoding's drafts
def test_stress_with_preemption_and_shared_prefixes(spec_k):
    rng = random.Random(0)
    shared = [rng.randrange(VOCAB) for _ in range(64)]
    prompts, params = [], []
    for i in range(200):
        n = rng.randint(1, 400)
        prompt = (shared + [rng.randrange(VOCAB) for _ in range(n)])[:n] if i % 3 == 0 else \
            [rng.randrange(VOCAB) for _ in range(n)]
        prompts.append(prompt)
        params.append(SamplingParams(max_tokens=rng.randint(1, 64), ignore_eos=True))
    engine, _ = make_engine(num_blocks=64, max_model_len=512, spec_k=spec_k)
    for i, (p, sp) in enumerate(zip(prompts, params)):
        engine.add_request(str(i), p, sp)
    outs = run(engine)
    assert len(outs) == 200
    for i, (p, sp) in enumerate(zip(prompts, params)):
        assert outs[str(i)].outputs[0].token_ids == expected(p, sp.max_tokens), i
    assert engine.scheduler.num_preemptions > 0
    assert engine.kv.pool.hits > 0
    assert engine.num_free_blocks == 64
    if spec_k is not None:
        stats = engine.scheduler.spec_stats
        assert 0 < stats.num_accepted_tokens < stats.num_draft_tokens


def test_abort_frees_blocks_and_others_continue():
    engine, _ = make_engine(num_blocks=32, max_model_len=512)
    engine.add_request("a", list(range(40)), SamplingParams(max_tokens=50))
    engine.add_request("b", list(range(1, 30)), SamplingParams(max_tokens=5))
    for _ in range(3):
        engine.step()
    aborted = engine.abort_request("a")
    assert aborted.output.finished and aborted.output.outputs[0].finish_reason == "abort"
    assert aborted.samples[0].finish_reason == "abort"
    outs = run(engine)
    assert outs["b"].outputs[0].token_ids == expected(list(range(1, 30)), 5)
    assert engine.num_free_blocks == 32


def test_n_samples_share_the_prompt_blocks():
    engine, _ = make_engine()
    prompt = list(range(5, 105))
    engine.add_request("p", prompt, SamplingParams(n=4, max_tokens=3))
    out = run(engine)["p"]
    assert [o.index for o in out.outputs] == [0, 1, 2, 3]
    assert engine.kv.pool.hits == 3 * (len(prompt) // BS) * BS


def test_length_limit_of_the_context():
    engine, _ = make_engine(max_model_len=64)
    engine.add_request("a", list(range(60)), SamplingParams(max_tokens=None))
    out = run(engine)["a"]
    assert len(out.outputs[0].token_ids) == 4 and out.outputs[0].finish_reason == "length"
    with pytest.raises(ValueError, match="maximum context length is 64"):
        engine.add_request("b", list(range(64)), SamplingParams())


def test_without_chunking_a_prompt_waits_for_a_whole_budget():
    engine, ex = make_engine(budget=128, chunked=False, max_model_len=128)
    engine.add_request("a", list(range(100)), SamplingParams(max_tokens=2))
    engine.add_request("b", list(range(100)), SamplingParams(max_tokens=2))
    run(engine)
    assert ex.max_batch_tokens <= 128


def test_prefix_hits_are_reported_per_request():
    engine, _ = make_engine()
    prompt = list(range(3, 70))
    engine.add_request("a", prompt, SamplingParams(max_tokens=2))
    run(engine)
    engine.add_request("b", prompt + [1, 2], SamplingParams(max_tokens=2))
    out = run(engine)["b"]
    assert out.num_cached_tokens == 64


def test_updates_are_deltas_that_add_up():
    engine, _ = make_engine()
    prompt = list(range(20))
    engine.add_request("a", prompt, SamplingParams(n=2, max_tokens=5, seed=1, temperature=1.0))
    got = {0: [], 1: []}
    finals = {}
    while engine.has_unfinished_requests():
        batch = engine.schedule()
        for update in engine.apply(engine.executor.execute(batch)):
            for s in update.samples:
                got[s.index] += s.token_ids
                if s.finish_reason:
                    finals[s.index] = s.finish_reason
    assert got[0] == got[1] == expected(prompt, 5)
    assert finals == {0: "length", 1: "length"}


@pytest.mark.parametrize("depth", [2, 3])
def test_pipelined_batches_never_share_a_request(depth):
    """With several batches in flight (pipeline parallelism), results still equal the sequential ones."""
    from collections import deque

    rng = random.Random(depth)
    prompts = [[rng.randrange(VOCAB) for _ in range(rng.randint(1, 200))] for _ in range(60)]
    lengths = [rng.randint(1, 40) for _ in prompts]
    engine, ex = make_engine(num_blocks=48, max_model_len=256, budget=128)
    for i, (p, n) in enumerate(zip(prompts, lengths)):
        engine.add_request(str(i), p, SamplingParams(max_tokens=n, ignore_eos=True))
    pending, outs, max_depth = deque(), {}, 0
    while engine.has_unfinished_requests():
        while len(pending) < depth:
            batch = engine.schedule()
            if batch is None:
                break
            ids = {c.request_id for c in batch.chunks}
            assert not ids & {c.request_id for b in pending for c in b[0].chunks}
            pending.append((batch, ex.execute(batch)))
        max_depth = max(max_depth, len(pending))
        assert pending, "nothing in flight and nothing schedulable: a stall"
        for update in engine.apply(pending.popleft()[1]):
            if update.output.finished:
                outs[update.output.request_id] = update.output
    assert max_depth == depth
    for i, (p, n) in enumerate(zip(prompts, lengths)):
        assert outs[str(i)].outputs[0].token_ids == expected(p, n)
    assert engine.scheduler.num_preemptions > 0 and engine.num_free_blocks == 48


def test_a_paused_request_gives_up_its_place_and_resumes_where_it_was():
    """Flow control: paused (its reader fell behind), a request is preempted at its next turn and not
    scheduled, others run on; resumed, it continues from its tokens, whole."""
    engine, _ = make_engine(max_num_seqs=2)
    slow, fast = list(range(1, 40)), list(range(100, 120))
    engine.add_request("slow", slow, SamplingParams(max_tokens=30, ignore_eos=True, n=2))
    for _ in range(3):
        engine.step()
    engine.pause_request("slow", True)
    engine.add_request("fast", fast, SamplingParams(max_tokens=12, ignore_eos=True))
    done = {}
    while "fast" not in done:
        for out in engine.step():
            assert out.request_id == "fast", "a paused request was scheduled"
            if out.finished:
                done["fast"] = out
    assert engine.schedule() is None and engine.scheduler.num_preemptions == 2  # both samples gave up their place
    engine.pause_request("slow", False)
    out = run(engine)["slow"]
    assert [o.token_ids for o in out.outputs] == [expected(slow, 30)] * 2
    assert done["fast"].outputs[0].token_ids == expected(fast, 12)
    engine.pause_request("gone", True)  # an unknown (finished) id: nothing

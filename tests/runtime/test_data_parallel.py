"""Data parallelism from Python: the offline LLM over two replicas, and the settings it refuses."""
import pytest

from actorserve import LLM, BeamSearchParams, SamplingParams
from actorserve.runtime.resolve import engine_config


def test_llm_over_two_replicas_answers_as_one_engine():
    prompts = ["The capital of France is", "def fibonacci(n):", "Once upon a time", "2 + 2 ="]
    greedy = SamplingParams(max_tokens=16, temperature=0)
    seeded = SamplingParams(max_tokens=16, temperature=1.0, seed=7)
    beams = BeamSearchParams(beam_width=2, max_tokens=4)
    one = LLM(max_model_len=1024, kv_cache_memory=64 << 20)
    expected = [o.outputs[0].token_ids for p in (greedy, seeded) for o in one.generate(prompts, p, use_tqdm=False)]
    expected_beams = [[s.tokens for s in o.sequences] for o in one.beam_search(prompts, beams)]
    with LLM(max_model_len=1024, kv_cache_memory=64 << 20, data_parallel_size=2) as two:
        got = [o.outputs[0].token_ids for p in (greedy, seeded) for o in two.generate(prompts, p, use_tqdm=False)]
        got_beams = [[s.tokens for s in o.sequences] for o in two.beam_search(prompts, beams)]  # (processes)
        assert sorted(two._sync.engine.child_pids()) == ["scheduler", "scheduler-dp1", "worker0", "worker0-dp1"]
    assert got == expected
    assert got_beams == expected_beams


@pytest.mark.parametrize("args, message", [
    ({"data_parallel_size": 0}, "data_parallel_size must be >= 1"),
    ({"data_parallel_size": 2, "mode": "inprocess"}, "needs mode='multiprocess'"),
    ({"data_parallel_size": 2, "client_address": "tcp://127.0.0.1:5555"}, "ZMQ client protocol serves one"),
])
def test_settings_that_cannot_work_are_refused(args, message):
    with pytest.raises(ValueError, match=message):
        engine_config(None, **args)


def test_the_cores_are_shared_out_over_every_worker():
    config = engine_config(None, data_parallel_size=2, pipeline_parallel_size=2)
    import os

    assert config.parallel.worker_threads() == max(1, (os.cpu_count() or 1) // 4)

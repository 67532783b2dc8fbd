"""The periodic stats line: throughput since the last line, the scheduler's state, quiet when idle."""
from actorserve.runtime.resolve import engine_config
from actorserve.runtime.engine.core import EngineCore, ModelFacts
from actorserve.runtime.engine.sampling_params import SamplingParams
from actorserve.runtime.engine.stats import StatsLine
from tests.runtime.engine.fake_executor import FakeExecutor


def test_the_line_counts_tokens_since_the_last_one_and_goes_quiet_when_idle():
    config = engine_config(kv_cache_memory=1 << 20, max_num_batched_tokens=64)
    core = EngineCore(config, FakeExecutor(16, 100), ModelFacts(100, None, 512, 64))
    stats = StatsLine(interval=10.0)
    assert stats.take(core, now=0.0) is None  # the first look only sets the baseline
    assert stats.take(core, now=10.0) is None  # idle from the start: nothing to say
    core.add_request("a", list(range(1, 41)), SamplingParams(max_tokens=5, ignore_eos=True))
    core.add_request("b", list(range(1, 11)), SamplingParams(max_tokens=5, ignore_eos=True))
    while core.has_unfinished_requests():
        core.step()
    line = stats.take(core, now=20.0)
    assert line.startswith("Avg prompt throughput: 5.0 tokens/s, Avg generation throughput: 1.0 tokens/s")
    assert "Running: 0 reqs, Waiting: 0 reqs" in line and "Prefix cache hit rate: 0.0%" in line
    idle = stats.take(core, now=30.0)  # one line of zeros as it falls idle, then silence
    assert idle.startswith("Avg prompt throughput: 0.0 tokens/s, Avg generation throughput: 0.0 tokens/s")
    assert stats.take(core, now=40.0) is None

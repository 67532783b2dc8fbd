"""Sleep mode and its allocator ledger, on the default model in this process (the offline ``LLM``).

The ledger must hold every buffer the engine keeps (an allocation outside it would survive sleep), each tag
must come back exactly once, greedy output after wake-up must equal the output before sleep, and level 2
must give back at least 90% of the weights' and the KV cache's bytes."""
import psutil
import pytest
import torch

from actorserve import LLM, EngineSleepingError, SamplingParams
from actorserve.runtime.model.memory.memory_ledger import AllocatorLedger, TagState

PROMPTS = ["The capital of France is", "def fibonacci(n):"]
GREEDY = SamplingParams(max_tokens=24, temperature=0)


def _llm(**overrides) -> LLM:
    return LLM(**{"enable_sleep_mode": True, "max_model_len": 1024, "kv_cache_memory": 64 << 20, **overrides})


def _tokens(llm: LLM) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY, use_tqdm=False)]


@pytest.fixture(scope="module", params=["float32", "bfloat16"])
def llm(request):
    if request.param == "bfloat16" and not torch.backends.mkldnn.is_available():
        pytest.skip("bf16 needs oneDNN")
    engine = _llm(dtype=request.param)
    engine.reference = _tokens(engine)
    return engine


def _ledger(llm: LLM) -> AllocatorLedger:
    return llm.engine.executor.sleep_mode.ledger


def test_no_allocation_escapes_the_ledger(llm):
    ledger = _ledger(llm)
    assert ledger.nbytes("weights") > 50 << 20 and ledger.nbytes("kv_cache") > 30 << 20
    assert ledger.escaped([llm.engine]) == []


def test_the_audit_finds_an_allocation_outside_the_ledger(llm):
    """The audit can fail: a buffer that a module gains after load is reported."""
    module = llm.engine.executor.model.model.layers["0"]
    module.stray = torch.ones(1 << 16)
    try:
        escaped = _ledger(llm).escaped([llm.engine])
        assert escaped == [f"(65536,) torch.float32 ({4 << 16} bytes)"]
    finally:
        del module.stray


@pytest.mark.parametrize("level", [1, 2, 1])
def test_greedy_output_after_wake_up_equals_before(llm, level):
    llm.sleep(level=level)
    assert llm.is_sleeping()
    with pytest.raises(EngineSleepingError):
        llm.generate(PROMPTS, GREEDY, use_tqdm=False)
    llm.wake_up()
    assert not llm.is_sleeping()
    assert _tokens(llm) == llm.reference
    assert _ledger(llm).escaped([llm.engine]) == []


def test_every_tag_is_restored_exactly_once(llm):
    ledger = _ledger(llm)
    before = dict(ledger.restores)
    llm.sleep(level=1)
    llm.wake_up(tags=["weights"])
    assert llm.is_sleeping() and ledger.state["kv_cache"] != TagState.RESIDENT
    with pytest.raises(EngineSleepingError):
        llm.generate(PROMPTS, GREEDY, use_tqdm=False)
    llm.wake_up(tags=["weights"])  # resident already: nothing is restored again
    llm.wake_up(tags=["kv_cache"])
    llm.wake_up()
    assert not llm.is_sleeping()
    assert {t: ledger.restores[t] - before[t] for t in before} == {"weights": 1, "kv_cache": 1, "workspace": 1}
    assert all(state == TagState.RESIDENT for state in ledger.state.values())
    with pytest.raises(RuntimeError, match="restored twice"):
        ledger.restore("weights")
    assert _tokens(llm) == llm.reference


def test_bad_levels_and_tags_are_value_errors(llm):
    for level in (0, 3, True):
        with pytest.raises(ValueError, match="sleep level"):
            llm.sleep(level=level)
    with pytest.raises(ValueError, match="tags"):
        llm.wake_up(tags=["weights", "everything"])
    with pytest.raises(ValueError, match="tags"):
        llm.wake_up(tags="weights")
    assert not llm.is_sleeping()


def test_sleep_mode_must_be_asked_for():
    llm = LLM(max_model_len=1024, kv_cache_memory=64 << 20)
    with pytest.raises(ValueError, match="enable_sleep_mode"):
        llm.sleep()


def test_level_2_gives_back_the_weights_and_the_kv_cache():
    llm = _llm(kv_cache_memory=128 << 20)
    reference = _tokens(llm)
    ledger = _ledger(llm)
    for k, v in llm.engine.executor.kv_caches:  # a cache full of keys: every page resident
        k.zero_()
        v.zero_()
    held = ledger.nbytes("weights") + ledger.nbytes("kv_cache")
    process = psutil.Process()
    before = process.memory_info().rss
    llm.sleep(level=2)
    during = process.memory_info().rss
    assert before - during >= 0.9 * held, (before >> 20, during >> 20, held >> 20)
    llm.wake_up()
    after = process.memory_info().rss
    assert after - during >= 0.9 * ledger.nbytes("weights")  # the weights are back; untouched KV pages are not
    assert _tokens(llm) == reference


# a hybrid model's recurrent-state slots (kv_cache) and MLA's latent cache, on the tiny random models of
# the logits tests
@pytest.mark.parametrize("kind", ["qwen3_next", "deepseek_v2"])
def test_other_caches_sleep_and_wake(kind, tmp_path):
    from tests.conftest import save_tiny_model
    from tests.runtime.model.architectures.test_decoder_vs_transformers import FAMILIES

    llm = LLM(str(save_tiny_model(kind, tmp_path / kind, **FAMILIES[kind])), enable_sleep_mode=True,
              skip_tokenizer_init=True, max_model_len=256, kv_cache_memory=16 << 20, max_num_seqs=4)
    prompts = [{"prompt_token_ids": [1, 5, 9, 20, 7]}, {"prompt_token_ids": [3, 4]}]
    reference = [o.outputs[0].token_ids for o in llm.generate(prompts, GREEDY, use_tqdm=False)]
    assert _ledger(llm).escaped([llm.engine]) == []
    for level in (1, 2):
        llm.sleep(level=level)
        llm.wake_up()
        assert [o.outputs[0].token_ids for o in llm.generate(prompts, GREEDY, use_tqdm=False)] == reference

"""The config tree: vLLM's dtype spellings, and a KV cache budget that is the same from start to start."""
import pytest

from actorserve.runtime import config as config_module
from actorserve.runtime.resolve import engine_config


@pytest.mark.parametrize("given,kept", [("half", "float16"), ("float", "float32"), ("bfloat16", "bfloat16"),
                                        ("auto", "auto")])
def test_dtype_spellings_become_one(given, kept):
    assert engine_config(dtype=given).model.dtype == kept
    with pytest.raises(ValueError, match="dtype"):
        engine_config(dtype="fp8")


def test_the_kv_budget_is_fixed_unless_memory_is_short(monkeypatch):
    monkeypatch.delenv(config_module.KV_SPACE_ENV, raising=False)
    monkeypatch.setattr(config_module, "_available_memory_bytes", lambda: 64 << 30)
    cache = engine_config().cache
    budget, why = cache.kv_cache_budget()
    assert budget == 4 << 30 and "default" in why
    monkeypatch.setattr(config_module, "_available_memory_bytes", lambda: 30 << 30)
    assert cache.kv_cache_budget()[0] == 4 << 30  # the same with less free memory: stable
    monkeypatch.setattr(config_module, "_available_memory_bytes", lambda: 6 << 30)
    budget, why = cache.kv_cache_budget()
    assert budget == 3 << 30 and "capped" in why
    monkeypatch.setenv(config_module.KV_SPACE_ENV, "0.5")
    assert cache.kv_cache_budget() == (512 << 20, config_module.KV_SPACE_ENV)
    assert engine_config(kv_cache_memory=1 << 20).cache.kv_cache_budget()[0] == 1 << 20
    monkeypatch.setenv(config_module.KV_SPACE_ENV, "lots")
    with pytest.raises(ValueError, match=config_module.KV_SPACE_ENV):
        engine_config()


def test_kv_cache_dtype_takes_vllms_spellings_it_builds():
    assert engine_config().cache.kv_cache_dtype == "auto"
    assert engine_config(kv_cache_dtype="bfloat16").cache.kv_cache_dtype == "bfloat16"
    with pytest.raises(ValueError, match="kv_cache_dtype must be one of"):
        engine_config(kv_cache_dtype="fp8")  # vLLM's, not built here


@pytest.mark.parametrize("value,on", [("", True), ("1", True), ("on", True), ("TRUE", True), ("0", False),
                                      ("false", False), ("Off", False), ("no", False)])
def test_the_kernels_switch_reads_the_usual_spellings(monkeypatch, value, on):
    monkeypatch.setenv("ACTORSERVE_CPU_KERNELS", value)
    assert engine_config().device.cpu_kernels is on


def test_a_misspelt_kernels_switch_is_refused(monkeypatch):
    monkeypatch.setenv("ACTORSERVE_CPU_KERNELS", "of")
    with pytest.raises(ValueError, match="ACTORSERVE_CPU_KERNELS must be one of"):
        engine_config()

"""Capability gates: independent predicates decided once, an ISA override that only ever lowers the CPU,
and bf16 / int8 models that load and generate with every path a lesser CPU would take."""
import pytest
import torch

from actorserve.kernels import capability
from actorserve.kernels.capability import CpuFeatures, CpuPaths
from actorserve.runtime.config import DeviceConfig, EngineConfig
from actorserve.runtime.resolve import engine_config, resolve

AVX512_BF16 = CpuFeatures("avx512", avx512_bf16=True, avx_ne_convert=False)


def test_the_override_lowers_and_never_raises_the_level():
    assert capability.masked(AVX512_BF16, None) == AVX512_BF16
    assert capability.masked(AVX512_BF16, "avx512") == AVX512_BF16
    assert capability.masked(AVX512_BF16, "avx2") == CpuFeatures("avx2", False, False)
    assert capability.masked(AVX512_BF16, "generic") == CpuFeatures("generic", False, False)
    avx2 = CpuFeatures("avx2", False, avx_ne_convert=True)
    assert capability.masked(avx2, "avx512") == avx2  # an override never adds instructions
    assert capability.masked(avx2, "generic").avx_ne_convert is False


def test_the_kernels_take_the_best_build_the_features_run():
    assert capability.kernel_isa(AVX512_BF16) == "avx512_bf16"
    assert capability.kernel_isa(CpuFeatures("avx512", False, False)) == "avx2"  # AVX-512 without BF16
    assert capability.kernel_isa(CpuFeatures("avx2", False, True)) == "avx2"
    assert capability.kernel_isa(CpuFeatures("generic", False, False)) is None


@pytest.mark.parametrize("isa", ["avx2", "generic"])
def test_a_lesser_cpu_takes_no_avx512_path(isa):
    paths = capability.detect(isa)
    assert paths.isa == isa and paths.hardware_isa in capability.ISAS
    assert paths.kernel_isa == ("avx2" if isa == "avx2" else None) and not paths.prepacked_bf16
    assert not paths.bf16_gemm  # bf16 products of many rows are widened to fp32 (kernels.gemm.widened)
    assert paths.int_mm == capability._int_mm_runs()  # independent of the ISA: torch falls back inside
    assert f"{isa} (override" in paths.describe() or paths.hardware_isa == isa


def test_kernels_off_switches_every_c_path_and_prepacking_but_not_the_int8_product():
    paths = capability.detect(None, kernels_enabled=False)
    assert paths.kernel_isa is None and not paths.prepacked_bf16
    assert paths.int_mm == capability._int_mm_runs()
    assert "ACTORSERVE_CPU_KERNELS=0" in paths.describe()


def test_the_hardware_level_is_what_torch_reads_from_cpuid():
    real = capability.hardware_features()
    assert (real.isa == "avx512") == torch.cpu._is_avx512_supported()
    assert (real.isa != "generic") == (torch.cpu._is_avx2_supported() or torch.cpu._is_avx512_supported())
    if real.avx512_bf16:
        assert real.isa == "avx512"


def test_the_config_resolves_the_paths_once_and_carries_them_to_children(monkeypatch):
    monkeypatch.setenv("ACTORSERVE_CPU_ISA", "avx2")
    config = engine_config(None)
    assert config.device.cpu_isa == "avx2" and config.device.cpu_paths.isa == "avx2"
    import msgspec

    decoded = msgspec.json.decode(msgspec.json.encode(config), type=EngineConfig)
    assert decoded.device.cpu_paths == config.device.cpu_paths
    assert resolve(config) is config  # already resolved: nothing is probed again
    with pytest.raises(ValueError, match="cpu_isa"):
        engine_config(None, cpu_isa="sse9")
    with pytest.raises(ValueError, match="must be one of"):
        capability.detect("avx1024")
    assert capability.paths_for(DeviceConfig(cpu_isa="generic")).isa == "generic"


@pytest.fixture
def installed_paths():
    """Restore this process's gates after a test installs others."""
    before = capability.current()
    yield
    capability.use(before)


@pytest.mark.parametrize("isa", ["avx2", "generic"])
@pytest.mark.parametrize("quantization", [None, "int8"])
def test_bf16_and_int8_models_load_and_generate_on_a_lesser_cpu(isa, quantization, tiny_llama_dir,
                                                               installed_paths, monkeypatch):
    """What crashed on AVX2-only CPUs (a bf16 weight handed to oneDNN's reorder): the gates route every
    product to a path that runs, and greedy tokens match the same model on torch's plain operators."""
    from actorserve import LLM, SamplingParams
    from actorserve.kernels.attention import cpu_decode
    from actorserve.kernels.gemm import prepacked
    from actorserve.runtime.model.architectures.layers import Linear

    monkeypatch.setattr(prepacked.PackedWeight, "__init__", _no_reorder)  # a lesser CPU raises here
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    prompts = [{"prompt_token_ids": [5, 6, 7, 8]}, {"prompt_token_ids": [9, 10]}]
    llm = LLM(str(tiny_llama_dir), dtype="bfloat16", quantization=quantization, cpu_isa=isa,
              skip_tokenizer_init=True, kv_cache_memory=8 << 20)
    assert capability.current().isa == isa
    model = llm.engine.executor.model
    assert all(m.packed is None or quantization for m in model.modules() if isinstance(m, Linear))
    # the decode fast path runs on the C kernels, which AVX2 has (one build per ISA) and generic lacks,
    # where the decode kernel takes the model's heads
    cfg = model.cfg
    takes = cpu_decode.supports(torch.bfloat16, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim)
    assert (llm.engine.executor.fast_decode is not None) == (isa == "avx2" and takes)
    out = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
    eager = LLM(str(tiny_llama_dir), dtype="bfloat16", quantization=quantization, cpu_isa=isa,
                skip_tokenizer_init=True, kv_cache_memory=8 << 20, cpu_kernels=False)
    assert out == [o.outputs[0].token_ids for o in eager.generate(prompts, params, use_tqdm=False)]
    assert all(len(t) == 8 for t in out)


def _no_reorder(self, weight):
    raise RuntimeError("mkldnn_reorder_linear_weight: bf16 path needs the cpu support avx_ne_convert or "
                       "avx512bw, avx512vl and avx512dq")


def test_library_env_only_ever_lowers_torchs_libraries():
    assert capability.library_env(None, "avx512") == {}
    assert capability.library_env("avx512", "avx512") == {}
    assert capability.library_env("avx2", "avx2") == {}  # ATen takes its variable on trust: never above the CPU
    assert capability.library_env("avx2", "generic") == {}
    env = capability.library_env("avx2", "avx512")
    assert env == {"ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2", "ATEN_CPU_CAPABILITY": "avx2"}
    assert capability.library_env("generic", "avx2")["ATEN_CPU_CAPABILITY"] == "default"


def test_holding_the_libraries_reads_the_variable_as_the_config_does():
    """An empty ACTORSERVE_CPU_ISA holds nothing (the engine's config reads it as unset); a misspelt one is
    refused by name, not with an index error."""
    assert capability.hold_libraries("") == {} and capability.hold_libraries(None) == {}
    with pytest.raises(ValueError, match="ACTORSERVE_CPU_ISA must be one of"):
        capability.hold_libraries("AVX2")


@pytest.mark.skipif(capability.hardware_features().isa != "avx512", reason="needs a CPU above AVX2")
def test_a_process_holding_its_libraries_runs_torch_at_that_level():
    """What the variables do: torch's vectorised operators at AVX2 and no oneDNN bf16 GEMM, as on an
    AVX2-only CPU (under the override alone, oneDNN kept its AVX-512 bf16 GEMM); and a process that has
    computed already cannot be held, which is said, not ignored."""
    import os
    import subprocess
    import sys

    probe = ("import torch\n{before}\nfrom actorserve.kernels import capability\n"
             "print(capability.hold_libraries('avx2'))\n"
             "print(torch.backends.cpu.get_cpu_capability(), torch.ops.mkldnn._is_mkldnn_bf16_supported())")
    env = {k: v for k, v in os.environ.items() if k not in ("ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS",
                                                           "ATEN_CPU_CAPABILITY")}
    held = subprocess.run([sys.executable, "-c", probe.format(before="")], env=env, capture_output=True,
                          text=True, check=True).stdout.splitlines()
    assert held == [str(capability.library_env("avx2", "avx512")), "AVX2 False"]
    late = subprocess.run([sys.executable, "-c", probe.format(before="torch.ones(2, 2) + 1")], env=env,
                          capture_output=True, text=True)
    assert late.returncode != 0 and "already run above it" in late.stderr


def test_children_start_with_torchs_libraries_at_the_override(monkeypatch):
    from actorserve.runtime.process import child_env

    for name in ("ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS", "ATEN_CPU_CAPABILITY"):
        monkeypatch.delenv(name, raising=False)
    native = engine_config(None, cpu_isa=None)
    lesser = engine_config(None, cpu_isa="generic")
    assert "ONEDNN_MAX_CPU_ISA" not in child_env(native)
    want = capability.library_env("generic", lesser.device.cpu_paths.hardware_isa)
    assert {k: child_env(lesser).get(k) for k in want} == want
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "SSE41")  # the caller's own setting wins
    assert child_env(engine_config(None, cpu_isa="avx2")).get("ONEDNN_MAX_CPU_ISA") == "SSE41"


def test_an_in_process_engine_says_when_torchs_libraries_stay_above_the_override(
        tiny_llama_dir, installed_paths, caplog):
    import logging

    from actorserve import LLM

    torch.ones(4, 4, dtype=torch.bfloat16) @ torch.ones(4, 4, dtype=torch.bfloat16)  # this process's libraries are set
    logger = logging.getLogger("actorserve")  # its own handler does not propagate: caplog's is added to it
    logger.addHandler(caplog.handler)
    try:
        LLM(str(tiny_llama_dir), cpu_isa="generic", skip_tokenizer_init=True, kv_cache_memory=4 << 20)
    finally:
        logger.removeHandler(caplog.handler)
    above = capability.libraries_above("generic")
    warned = [r.getMessage() for r in caplog.records if "emulate the lesser CPU whole" in r.getMessage()]
    assert bool(warned) == bool(above)
    if above:
        assert "ATEN_CPU_CAPABILITY=default" in warned[0]


def test_paths_are_a_frozen_value():
    paths = CpuPaths("avx2", "avx512")
    with pytest.raises(AttributeError):
        paths.isa = "avx512"

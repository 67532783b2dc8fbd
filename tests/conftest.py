"""Shared fixtures: the real default model (loaded once), the reference data, tiny random HF models."""
from __future__ import annotations

import faulthandler
import json
import os
import signal
import sys
from pathlib import Path

import pytest

from actorserve.kernels import capability

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT.parent / "shared" / "reference"

# Under ACTORSERVE_CPU_ISA (make test-isa), torch's own libraries at that level too, before any test
# computes: the tests, their torch references and the processes they start see the lesser CPU whole.
capability.hold_libraries(os.environ.get("ACTORSERVE_CPU_ISA"))

# No test may hang the suite: past its limit a test fails with every thread's stack on stderr (its
# finally blocks still stop what it started), and a test that cannot be interrupted there (stuck in a
# C call) ends the whole run a minute later, so CI reports a failure rather than its own time-out.
TIME_LIMIT_S = float(os.environ.get("ACTORSERVE_TEST_TIME_LIMIT_S", "300"))


class TimeLimitExceeded(BaseException):
    """BaseException, so that a test's own ``except Exception`` cannot swallow it."""


def _time_limit(item) -> float:
    marker = item.get_closest_marker("time_limit")
    return float(marker.args[0]) if marker is not None else TIME_LIMIT_S


def _timed_out(signum, frame):
    faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
    raise TimeLimitExceeded("the test ran past its time limit")


def _arm(item) -> None:
    """Each phase (setup, call, teardown) gets the whole limit."""
    limit = _time_limit(item)
    signal.setitimer(signal.ITIMER_REAL, limit)
    faulthandler.dump_traceback_later(limit + 60, exit=True)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    previous = signal.signal(signal.SIGALRM, _timed_out)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        faulthandler.cancel_dump_traceback_later()
        signal.signal(signal.SIGALRM, previous)


def pytest_collection_modifyitems(config, items):
    """Tests marked ``cuda`` skip, saying so, where torch sees no CUDA device (scripts/gpu_check.sh runs them)."""
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (scripts/gpu_check.sh runs it on one)")
    for item in items:
        if item.get_closest_marker("cuda") is not None:
            item.add_marker(skip)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item):
    _arm(item)
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    _arm(item)
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item, nextitem):
    _arm(item)
    yield


def reference(name: str) -> dict:
    path = REFERENCE / name
    if not path.exists():
        pytest.fail(f"reference data {path} is missing (shared/ must sit beside the checkout)")
    return json.loads(path.read_text())


@pytest.fixture(scope="session")
def greedy_reference() -> dict:
    return reference("smollm2_greedy.json")


@pytest.fixture(scope="session")
def smollm():
    from actorserve import LLM

    return LLM(kv_cache_memory=256 << 20, max_model_len=2048)


@pytest.fixture(scope="session")
def hf_smollm():
    """The default model as transformers' Llama, holding exactly the values our GGUF loader decodes
    (transformers' own GGUF path needs accelerate, which is not a dependency here)."""
    import transformers

    from actorserve.runtime.model.weights.gguf_weights import iter_tensors, open_gguf
    from actorserve.runtime.model_files import resolve_model_path

    reader, cfg = open_gguf(resolve_model_path(None))
    config = transformers.LlamaConfig(
        vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers, num_attention_heads=cfg.num_heads, num_key_value_heads=cfg.num_kv_heads,
        head_dim=cfg.head_dim, rms_norm_eps=cfg.rms_norm_eps, rope_theta=cfg.rope_theta,
        max_position_embeddings=cfg.max_position_embeddings, tie_word_embeddings=cfg.tie_word_embeddings)
    model = transformers.LlamaForCausalLM(config).eval()
    missing, unexpected = model.load_state_dict(dict(iter_tensors(reader, cfg)), strict=False)
    assert missing == ["lm_head.weight"] and not unexpected  # the head is tied to the embedding
    return model


def save_tiny_model(kind: str, directory: Path, seed: int = 0, **overrides) -> Path:
    """A random-initialised transformers model of the given family, saved as an HF directory."""
    import torch
    import transformers

    common = dict(vocab_size=384, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                  rms_norm_eps=1e-6, tie_word_embeddings=False, eos_token_id=None, bos_token_id=None,
                  pad_token_id=None)
    common.update(overrides)
    klass = {"llama": transformers.LlamaConfig, "qwen2": transformers.Qwen2Config,
             "qwen3": transformers.Qwen3Config, "mistral": transformers.MistralConfig,
             "phi3": transformers.Phi3Config, "qwen3_moe": transformers.Qwen3MoeConfig,
             "qwen2_moe": transformers.Qwen2MoeConfig, "mixtral": transformers.MixtralConfig,
             "olmoe": transformers.OlmoeConfig, "gemma2": transformers.Gemma2Config,
             "gemma3": transformers.Gemma3TextConfig, "qwen3_next": transformers.Qwen3NextConfig,
             "deepseek_v2": transformers.DeepseekV2Config}[kind]
    config = klass(**common)
    if kind == "gemma3":  # (its config class is the text model's; the checkpoint names the causal LM)
        config.architectures = ["Gemma3ForCausalLM"]
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, torch_dtype=torch.float32)
    with torch.no_grad():  # spread the logits so greedy choices are far from ties
        for name, p in model.named_parameters():
            if p.dim() >= 2:  # (MoE experts are stacked, 3-D)
                p.normal_(0.0, 0.08)
            elif kind.startswith("gemma") or kind == "qwen3_next":  # (norms mean 1 + w: zeros would hide w)
                if name.endswith("linear_attn.norm.weight"):  # (Qwen3-Next's gated norm means w itself)
                    p.normal_(1.0, 0.3)
                elif name.endswith("norm.weight"):
                    p.normal_(0.0, 0.3)
    model.save_pretrained(directory)
    return directory


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory) -> Path:
    return save_tiny_model("llama", tmp_path_factory.mktemp("tiny-llama"), tie_word_embeddings=True)


@pytest.fixture(autouse=True, scope="session")
def _quiet_tokenizers():
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

"""The model registry: every family it lists loads by its checkpoint's names, what it does not list is
refused with the list, and docs/python-api.md's list is the registry's. Rotary tables belong to each model."""
import json
import re
from pathlib import Path

import pytest
import torch

from actorserve.runtime.errors import ModelLoadError
from actorserve.runtime.model.architectures import registry
from actorserve.runtime.model.weights.loader import load_model
from tests.conftest import save_tiny_model

ROOT = Path(__file__).resolve().parents[4]


def test_each_family_is_found_by_its_architectures_and_model_type():
    for family in registry.FAMILIES:
        for arch in family.hf_architectures:
            assert registry.family_of_hf({"architectures": [arch]}) is family
        for model_type in family.hf_model_types:
            assert registry.family_of_hf({"model_type": model_type}) is family
        for arch in family.gguf_architectures:
            assert registry.family_of_gguf(arch) is family


def test_an_unsupported_architecture_is_a_model_load_error_listing_the_supported(tmp_path):
    directory = save_tiny_model("llama", tmp_path / "m")
    config = json.loads((directory / "config.json").read_text())
    config.update(architectures=["GPTBigCodeForCausalLM"], model_type="gpt_bigcode")
    (directory / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelLoadError, match=r"unsupported architecture GPTBigCodeForCausalLM; supported: "
                                             r"LlamaForCausalLM .*Phi3ForCausalLM"):
        load_model(str(directory), "float32", skip_tokenizer=True)
    with pytest.raises(ModelLoadError, match="unsupported GGUF architecture .gpt2.; supported: deepseek2, gemma2, "):
        registry.family_of_gguf("gpt2")


@pytest.mark.parametrize("family, overrides, window, layers", [
    ("mistral", dict(sliding_window=64), 64, (0, 1, 2, 3)),
    ("mistral", dict(sliding_window=4096), None, ()),  # no shorter than the positions: slides nowhere
    ("mistral", dict(sliding_window=None), None, ()),
    ("qwen2", dict(sliding_window=64, use_sliding_window=False), None, ()),  # Qwen's switch is off
    ("qwen2", dict(sliding_window=64, use_sliding_window=True, max_window_layers=2), 64, (2, 3)),
    ("gemma2", dict(sliding_window=64), 64, (0, 2)),  # every other layer
    ("gemma3", dict(sliding_window=64), 64, (0, 1, 2, 3)),  # five in six: all four here
    ("gemma3", dict(sliding_window=64, layer_types=["sliding_attention", "full_attention"] * 2), 64, (0, 2)),
])
def test_which_layers_slide_as_the_config_says(tmp_path, family, overrides, window, layers):
    from actorserve.runtime.model.weights.hf_weights import read_config

    cfg = read_config(str(save_tiny_model(family, tmp_path / "m", num_hidden_layers=4, **overrides)))
    assert (cfg.sliding_window, cfg.sliding_layers) == (window, layers)
    assert cfg.all_layers_windowed == (len(layers) == 4)


def test_two_models_with_different_rope_keep_their_own_tables(tmp_path):
    """One process, two models, two rope settings: each model's table is its own (no cache shared
    between instances keyed by something that collides), and a third model does not disturb them."""
    a = load_model(str(save_tiny_model("llama", tmp_path / "a", rope_theta=10000.0)), "float32",
                   skip_tokenizer=True).model
    b = load_model(str(save_tiny_model("llama", tmp_path / "b", rope_theta=500000.0, rope_scaling={
        "rope_type": "linear", "factor": 4.0})), "float32", skip_tokenizer=True).model
    cos_a, cos_b = a.rotary.cos.clone(), b.rotary.cos.clone()
    assert not torch.allclose(cos_a, cos_b)
    positions = torch.arange(5, 9)
    inv = 1.0 / (10000.0 ** (torch.arange(0, 16, 2).float() / 16))
    expected_a = torch.cat([positions[:, None].float() * inv] * 2, dim=-1).cos()
    torch.testing.assert_close(a.rotary.table(positions, torch.float32)[0][:, 0], expected_a)
    load_model(str(save_tiny_model("llama", tmp_path / "c", rope_theta=1234.0)), "float32", skip_tokenizer=True)
    assert torch.equal(a.rotary.cos, cos_a) and torch.equal(b.rotary.cos, cos_b)


def test_the_python_api_doc_lists_the_registry():
    text = (ROOT / "docs" / "python-api.md").read_text()
    section = text.split("### Supported architectures", 1)[1].split("\n#", 1)[0]
    listed = [line for line in section.splitlines() if line.startswith("- `")]
    assert listed == registry.markdown().splitlines()  # python -m actorserve.runtime.model.architectures.registry
    assert re.findall(r"^- `(\w+)`", section, re.M) == [a for f in registry.FAMILIES for a in f.hf_architectures]

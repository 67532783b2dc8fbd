"""Weight loading: GGUF of every supported type against transformers, and loud failures."""
import subprocess
import sys

import numpy as np
import pytest
import torch

from actorserve.runtime.errors import ModelLoadError
from actorserve.runtime.model.weights.loader import load_model
from tests.conftest import save_tiny_model

GGUF_NAMES = {
    "model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}
LAYER = {
    "input_layernorm.weight": "attn_norm.weight", "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight", "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight", "self_attn.o_proj.weight": "attn_output.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}


def _gguf_name(hf: str) -> str:
    if hf in GGUF_NAMES:
        return GGUF_NAMES[hf]
    _, _, i, rest = hf.split(".", 3)
    return f"blk.{i}.{LAYER[rest]}"


def _permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """What llama.cpp's converter does to Llama q/k rows."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _random_kquant(shape, qtype, rng):
    """Valid K-quant bytes (K-quants cannot be quantized by gguf-py): random payload, small fp16 scales."""
    from gguf import GGML_QUANT_SIZES

    block, size = GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, size=(shape[0], shape[1] // block, size), dtype=np.uint8)
    scale = np.frombuffer(np.float16(0.002).tobytes(), dtype=np.uint8)
    if qtype.name == "Q4_K":
        raw[..., 0:2] = scale
        raw[..., 2:4] = scale
    else:  # Q6_K keeps d last
        raw[..., -2:] = scale
    return raw.reshape(shape[0], -1)


def _write_gguf(hf_dir, path, qtype_name, dims, odd=None):
    """Write the HF model as llama.cpp would (q/k rows permuted); returns the weights the file holds.

    Every 2-D weight takes qtype; K-quants, which gguf-py cannot quantize, get random valid blocks in the
    MLP and F32 elsewhere. ``odd``: (checkpoint name, type name) of one tensor written as random blocks of
    that type instead.
    """
    import gguf
    from gguf import GGMLQuantizationType as T
    from gguf import quants
    from safetensors.torch import load_file

    qtype = T[qtype_name]
    hidden, heads, head_dim = dims
    state = load_file(str(hf_dir / "model.safetensors"))
    rng = np.random.default_rng(0)
    writer = gguf.GGUFWriter(str(path), "llama")
    for key, value in [("block_count", 2), ("context_length", 1024), ("embedding_length", hidden),
                       ("feed_forward_length", 256), ("attention.head_count", heads),
                       ("attention.head_count_kv", 2), ("vocab_size", 384), ("attention.key_length", head_dim)]:
        writer.add_uint32(f"llama.{key}", value)
    writer.add_float32("llama.rope.freq_base", 10000.0)
    writer.add_float32("llama.attention.layer_norm_rms_epsilon", 1e-6)
    expected = {}
    for name, tensor in state.items():
        w = tensor.numpy().astype(np.float32)
        if odd is not None and name == odd[0]:
            writer.add_tensor(_gguf_name(name), _random_kquant(w.shape, T[odd[1]], rng), raw_dtype=T[odd[1]])
        elif qtype_name in ("Q4_K", "Q6_K") and "mlp" in name:
            data = _random_kquant(w.shape, qtype, rng)
            expected[name] = quants.dequantize(data, qtype).reshape(w.shape)
            writer.add_tensor(_gguf_name(name), data, raw_dtype=qtype)
        elif w.ndim == 1 or qtype in (T.F32, T.Q4_K, T.Q6_K):
            expected[name] = w
            writer.add_tensor(_gguf_name(name), _maybe_permute(name, w, heads))
        else:  # quantization is per row, so permuting rows before or after it is the same
            expected[name] = quants.dequantize(quants.quantize(w, qtype), qtype).reshape(w.shape)
            writer.add_tensor(_gguf_name(name), quants.quantize(_maybe_permute(name, w, heads), qtype),
                              raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return {k: torch.from_numpy(np.ascontiguousarray(v, dtype=np.float32)) for k, v in expected.items()}


def _maybe_permute(name, w, heads):
    if "q_proj" in name:
        return _permute(w, heads)
    if "k_proj" in name:
        return _permute(w, 2)
    return w


@pytest.mark.parametrize("qtype", ["F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q6_K"])
def test_gguf_types_load_exactly(qtype, tmp_path):
    """Every parameter equals the file's dequantized weight with q/k rows un-permuted."""
    dims = (256, 4, 64)  # K-quant rows must be multiples of 256
    hf_dir = save_tiny_model("llama", tmp_path / "hf", seed=3, hidden_size=dims[0], intermediate_size=256,
                             num_attention_heads=dims[1], head_dim=dims[2])
    path = tmp_path / f"tiny-{qtype}.gguf"
    expected = _write_gguf(hf_dir, path, qtype, dims)
    loaded = load_model(str(path), skip_tokenizer=True)
    assert loaded.cfg.head_dim == 64 and not loaded.cfg.tie_word_embeddings
    assert set(loaded.model.checkpoint_layout()) == set(expected)
    for name, value in expected.items():
        torch.testing.assert_close(loaded.model.checkpoint_tensor(name), value, rtol=0, atol=0, msg=name)


def test_a_block_type_not_supported_fails_before_any_weight_is_read(tmp_path, monkeypatch):
    from actorserve.runtime.model.weights.gguf_file import GGUFFile

    dims = (256, 4, 64)
    hf_dir = save_tiny_model("llama", tmp_path / "hf", seed=3, hidden_size=dims[0], intermediate_size=256,
                             num_attention_heads=dims[1], head_dim=dims[2])
    path = tmp_path / "tiny-iq2.gguf"
    _write_gguf(hf_dir, path, "Q8_0", dims, odd=("model.layers.1.mlp.down_proj.weight", "IQ2_XXS"))

    def read(self, t):
        raise AssertionError(f"{t.name} was read")
    monkeypatch.setattr(GGUFFile, "tensor_data", read)
    with pytest.raises(ModelLoadError, match=r"GGUF tensor blk\.1\.ffn_down\.weight has type IQ2_XXS; "
                                             r"supported: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL, "):
        load_model(str(path), skip_tokenizer=True)


def test_missing_parameter_is_named(tmp_path):
    from safetensors.torch import load_file, save_file

    hf_dir = save_tiny_model("qwen2", tmp_path / "q", seed=0)
    state = load_file(str(hf_dir / "model.safetensors"))
    del state["model.layers.1.self_attn.k_proj.bias"]
    save_file(state, str(hf_dir / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ModelLoadError, match=r"model\.layers\.1\.self_attn\.k_proj\.bias"):
        load_model(str(hf_dir), skip_tokenizer=True)


def test_unknown_tensor_and_bad_shape_are_errors(tmp_path):
    from safetensors.torch import load_file, save_file

    hf_dir = save_tiny_model("llama", tmp_path / "l", seed=0)
    state = load_file(str(hf_dir / "model.safetensors"))
    state["model.layers.0.mystery.weight"] = torch.zeros(3)
    save_file(state, str(hf_dir / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ModelLoadError, match="mystery"):
        load_model(str(hf_dir), skip_tokenizer=True)
    del state["model.layers.0.mystery.weight"]
    state["model.norm.weight"] = torch.zeros(65)
    save_file(state, str(hf_dir / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ModelLoadError, match="model.norm.weight"):
        load_model(str(hf_dir), skip_tokenizer=True)


@pytest.mark.parametrize("tied", [False, True])
def test_last_pipeline_stage_reads_the_embedding_only_where_tied(tied, tmp_path):
    """An untied checkpoint's last stage has its own lm_head and no embedding table to fill."""
    directory = save_tiny_model("llama", tmp_path / "m", num_hidden_layers=2, tie_word_embeddings=tied)
    last = load_model(str(directory), skip_tokenizer=True, pp_rank=1, pp_size=2).model
    assert (last.model.embed_tokens is not None) == tied and (last.lm_head is None) == tied
    first = load_model(str(directory), skip_tokenizer=True, pp_rank=0, pp_size=2).model
    assert first.model.embed_tokens is not None and first.lm_head is None


def test_an_hf_hub_id_resolves_from_the_local_cache_only(tmp_path, monkeypatch):
    from actorserve.runtime.model_files import resolve_model_path

    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    repo = tmp_path / "hub" / "models--Org--Tiny"
    (repo / "snapshots" / "abc123").mkdir(parents=True)
    (repo / "snapshots" / "def456").mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("abc123")
    assert resolve_model_path("Org/Tiny") == str(repo / "snapshots" / "abc123")
    assert resolve_model_path("Org/Tiny@def456") == str(repo / "snapshots" / "def456")
    with pytest.raises(ModelLoadError, match="cannot download") as err:
        resolve_model_path("Org/Missing")
    assert str(tmp_path / "hub" / "models--Org--Missing") in str(err.value)


def test_a_model_that_needs_its_own_code_is_refused_and_auto_dtype_reads_the_checkpoint(tmp_path):
    import json

    from actorserve.runtime.model.weights.loader import checkpoint_dtype, read_arch_config
    from actorserve.runtime.model_files import resolve_model_path

    model = save_tiny_model("llama", tmp_path / "m")
    assert checkpoint_dtype(str(model)) == "float32"
    assert checkpoint_dtype(resolve_model_path(None)) == "float32"  # GGUF
    config = json.loads((model / "config.json").read_text())
    config["dtype"] = "bfloat16"
    config["auto_map"] = {"AutoModelForCausalLM": "modeling_custom.Custom"}
    (model / "config.json").write_text(json.dumps(config))
    assert checkpoint_dtype(str(model)) == "bfloat16"
    with pytest.raises(ModelLoadError, match="auto_map"):
        read_arch_config(str(model))


def test_loading_the_default_model_imports_no_sympy():
    """Materialising the meta-built model must not pull in torch's symbolic shapes (sympy, mpmath): hundreds
    of modules that stay resident for nothing."""
    code = ("import sys; from actorserve.runtime.model.weights.loader import load_model; "
            "load_model(None, 'float32', skip_tokenizer=True); "
            "print(sorted(m for m in ('sympy', 'mpmath') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=300)
    assert out.stdout.strip().splitlines()[-1] == "[]"

"""The quantization seam: each load picks one method, named or by default; a method that cannot run the
model here says why; the GGUF blocks are held as stored and give the dense model's greedy tokens."""
import pytest
import torch

from actorserve.kernels.gemm import GgufQ8Weight, GgufWeight, Int8Weight, gguf, gguf_q8
from actorserve.runtime.resolve import REGISTRIES, engine_config
from actorserve.runtime.errors import ModelLoadError
from actorserve.runtime.model.weights import loader, quantization
from actorserve.runtime.model.architectures.layers import Linear

needs_gguf_kernels = pytest.mark.skipif(not gguf.available(), reason="needs a CPU with AVX2 and a C compiler")


def test_the_config_and_the_cli_take_the_registry_names(capsys):
    from actorserve.cli import main

    assert tuple(REGISTRIES["quantization"]) == tuple(quantization.METHODS)
    assert set(quantization.METHODS) >= {"int8", "gguf", "gguf_q8"}
    assert engine_config(quantization="gguf_q8").model.quantization == "gguf_q8"
    with pytest.raises(ValueError, match="speculative_config quantization must be one of"):
        engine_config(speculative_config={"method": "draft_model", "model": "draft.gguf", "quantization": "fp8",
                                          "num_speculative_tokens": 2})
    with pytest.raises(SystemExit) as exit:
        main(["generate", "--help"])
    assert exit.value.code == 0
    assert "{" + ",".join(quantization.METHODS) + "}" in capsys.readouterr().out


def test_selection_and_its_refusals():
    with pytest.raises(ValueError, match="must be one of"):
        quantization.select("fp8", "float32", "cpu", True)
    assert isinstance(quantization.select(None, "bfloat16", "cpu", True), quantization.Dense)
    assert isinstance(quantization.select(None, "float32", "cpu", False), quantization.Dense)
    assert quantization.select("int8", "bfloat16", "cpu", False).name == "int8"
    with pytest.raises(ValueError, match="needs a .gguf model"):
        quantization.select("gguf", "float32", "cpu", False)
    with pytest.raises(ValueError, match="float32 on the CPU"):
        quantization.select("gguf", "bfloat16", "cpu", True)
    expected = "gguf" if gguf.available() else ""
    assert quantization.select(None, "float32", "cpu", True).name == expected  # q8 is never the default
    with pytest.raises(ValueError, match="needs a .gguf model"):
        quantization.select("gguf_q8", "float32", "cpu", False)
    with pytest.raises(ValueError, match="float32 on the CPU"):
        quantization.select("gguf_q8", "bfloat16", "cpu", True)


def _kinds(net) -> set[type]:
    return {type(m.packed) for m in net.modules() if isinstance(m, Linear)}


@needs_gguf_kernels
def test_the_default_gguf_model_holds_its_blocks_and_int8_or_bf16_do_not():
    held = loader.load_model(None, max_positions=64, skip_tokenizer=True)
    assert _kinds(held.model) == {GgufWeight} and held.model.model.embed_tokens.weight is None
    assert held.model._tied_head is held.model.model.embed_tokens.blocks  # one copy: lookups and the head
    named = loader.load_model(None, max_positions=64, skip_tokenizer=True, quantization="gguf")
    assert _kinds(named.model) == {GgufWeight}
    int8 = loader.load_model(None, "bfloat16", max_positions=64, skip_tokenizer=True, quantization="int8")
    assert _kinds(int8.model) == {Int8Weight} and int8.model.model.embed_tokens.weight is not None
    with pytest.raises(ModelLoadError, match="float32 on the CPU"):
        loader.load_model(None, "bfloat16", max_positions=64, skip_tokenizer=True, quantization="gguf")


@needs_gguf_kernels
def test_held_blocks_give_the_dense_models_logits_and_tokens(monkeypatch):
    """The same file loaded both ways: logits agree up to the order of the sums, and greedy tokens match."""
    from actorserve import LLM, SamplingParams

    held = LLM(kv_cache_memory=8 << 20, max_model_len=128, skip_tokenizer_init=True)
    monkeypatch.setattr(quantization.GgufBlocks, "check", lambda self, *a: "off for this comparison")
    dense = LLM(kv_cache_memory=8 << 20, max_model_len=128, skip_tokenizer_init=True)
    assert _kinds(dense.engine.executor.model) == {type(None)}
    ids = torch.tensor([1, 9690, 28, 253, 1025, 314])
    a, b = held.engine.executor.model, dense.engine.executor.model
    emb_a, emb_b = a.model.embed_tokens(ids), b.model.embed_tokens(ids)
    assert torch.equal(emb_a, emb_b)  # lookups decode the rows exactly
    hidden = torch.randn(3, a.cfg.hidden_size, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(a.compute_logits(hidden), b.compute_logits(hidden), rtol=1e-4, atol=1e-4)
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    prompts = [{"prompt_token_ids": [1, 9690, 28, 253]}, {"prompt_token_ids": list(range(100, 140))}]
    got = [o.outputs[0].token_ids for o in held.generate(prompts, params, use_tqdm=False)]
    want = [o.outputs[0].token_ids for o in dense.generate(prompts, params, use_tqdm=False)]
    assert got == want


@pytest.mark.skipif(not (gguf.available() and gguf_q8.available()), reason="needs the q8 products")
def test_q8_products_hold_the_file_once_and_stay_near_the_exact_logits(monkeypatch):
    """``gguf_q8``: every linear and the tied table repacked (no other copy: lookups decode the repacked
    table, to the exact model's bits); the logits stay near the exact model's, a few hundredths of their
    spread, where a wrong block, scale or row would be far off."""
    exact = loader.load_model(None, max_positions=64, skip_tokenizer=True).model
    q8 = loader.load_model(None, max_positions=64, skip_tokenizer=True, quantization="gguf_q8").model
    assert _kinds(q8) == {GgufQ8Weight}
    table = q8.model.embed_tokens.blocks
    assert q8._tied_head is table and isinstance(table, GgufQ8Weight) and q8.model.embed_tokens.weight is None
    assert table.nbytes == exact.model.embed_tokens.blocks.nbytes  # the file's bytes (49152 rows: no padding)
    ids = torch.tensor([1, 9690, 28, 253, 1025, 314, 49151])
    assert torch.equal(q8.model.embed_tokens(ids), exact.model.embed_tokens(ids))
    hidden = torch.randn(4, exact.cfg.hidden_size, generator=torch.Generator().manual_seed(0))
    a, b = exact.compute_logits(hidden), q8.compute_logits(hidden)
    assert ((a - b).norm(dim=-1) <= 0.03 * a.norm(dim=-1)).all()
    assert (a.argmax(-1) == b.argmax(-1)).all()

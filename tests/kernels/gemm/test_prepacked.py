"""Prepacked bf16 weights: the same products as F.linear on the plain weight, for every batch size."""
import pytest
import torch
from torch.nn import functional as F

from actorserve.kernels.gemm import linear, prepacked
from actorserve.runtime.model.architectures.layers import Linear
from tests.conftest import save_tiny_model

pytestmark = pytest.mark.skipif(not prepacked.available(), reason="torch without oneDNN")


@pytest.mark.parametrize("rows", [0, 1, 3, 8, 9, 33, 300])
@pytest.mark.parametrize("with_bias", [False, True])
def test_packed_linear_is_torch_linear(rows, with_bias):
    torch.manual_seed(rows)
    w = torch.randn(200, 96).bfloat16()
    b = torch.randn(200).bfloat16() if with_bias else None
    x = torch.randn(rows, 96).bfloat16()
    packed = prepacked.PackedWeight(w)
    # oneDNN's own bf16 GEMM either way, so the results are the same bits
    assert torch.equal(prepacked.packed_linear(x, packed, b), F.linear(x, w, b))


def test_leading_dims_and_strided_input():
    w = torch.randn(64, 48).bfloat16()
    packed = prepacked.PackedWeight(w)
    x = torch.randn(2, 5, 48).bfloat16()
    assert torch.equal(prepacked.packed_linear(x, packed), F.linear(x, w))
    strided = torch.randn(7, 96).bfloat16()[:, ::2]
    assert torch.equal(prepacked.packed_linear(strided, packed), F.linear(strided, w))


def test_gate_and_errors():
    assert not prepacked.applies(torch.randn(4, 4))  # fp32 stays on torch's plain path
    assert prepacked.applies(torch.randn(4, 4).bfloat16())
    with pytest.raises(ValueError, match="bf16 CPU matrix"):
        prepacked.PackedWeight(torch.randn(4, 4))
    packed = prepacked.PackedWeight(torch.randn(8, 16).bfloat16())
    with pytest.raises(ValueError, match="16 features"):
        prepacked.packed_linear(torch.randn(2, 12).bfloat16(), packed)
    with pytest.raises(ValueError, match="neither"):
        linear(torch.randn(2, 16).bfloat16(), None)


@pytest.mark.parametrize("tied", [False, True])
def test_prepacked_model_gives_the_unpacked_models_logits(tied, tmp_path, monkeypatch):
    """The loader prepacks bf16 models; their outputs are those of the same model left plain, and the
    linears no longer hold a plain copy."""
    from actorserve.runtime.model.weights import loader

    directory = save_tiny_model("llama", tmp_path / "m", seed=3, tie_word_embeddings=tied)
    packed = loader.load_model(str(directory), "bfloat16", skip_tokenizer=True).model
    linears = [m for m in packed.modules() if isinstance(m, Linear)]
    assert linears and all(m.weight is None and m.packed is not None for m in linears)
    assert (packed._tied_head is not None) == tied
    monkeypatch.setattr(loader.CausalLM, "prepack", lambda self: 0)
    plain = loader.load_model(str(directory), "bfloat16", skip_tokenizer=True).model
    assert all(m.weight is not None and m.packed is None for m in plain.modules() if isinstance(m, Linear))
    for rows in (1, 37):
        hidden = torch.randn(rows, plain.cfg.hidden_size).bfloat16()
        assert torch.equal(packed.compute_logits(hidden), plain.compute_logits(hidden))
        assert torch.equal(packed.model.layers["0"].mlp(hidden), plain.model.layers["0"].mlp(hidden))

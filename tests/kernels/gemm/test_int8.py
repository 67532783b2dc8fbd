"""W8A8 int8 products: the C row passes equal their torch references bit for bit, the int32 product is
exact, and the result approximates the float product within int8's resolution."""
import pytest
import torch
from torch.nn import functional as F

from actorserve.kernels.elementwise import silu_mul_ref
from actorserve.kernels.gemm import int8, linear
from actorserve.runtime.model.architectures.layers import Linear
from tests.conftest import save_tiny_model

needs_kernels = pytest.mark.skipif(not int8.kernels_available(), reason="needs AVX2 and a C compiler")

SHAPES = [(1, 576), (3, 100), (7, 17), (300, 1536), (2048, 64)]  # 16-lane tails; both thread paths


def rows(m, k, seed=0):
    x = (torch.randn(m, k, generator=torch.Generator().manual_seed(seed)) * 3).bfloat16()
    x[0, :] = 0  # a row of zeros: scale 0, zeros out
    return x


@needs_kernels
@pytest.mark.parametrize("m,k", SHAPES)
def test_quantize_rows_matches_the_reference(m, k):
    x = rows(m, k)
    q, s = int8.quantize_rows(x)
    q_ref, s_ref = int8.quantize_ref(x)
    assert q.dtype == torch.int8 and torch.equal(q, q_ref) and torch.equal(s, s_ref)
    assert s[0] == 0 and not q[0].any()
    assert (q[1:].abs().amax(-1) == int8.QMAX).all()  # each nonzero row reaches the full range


@needs_kernels
@pytest.mark.parametrize("m,n", SHAPES)
@pytest.mark.parametrize("with_bias", [False, True])
def test_dequant_rows_matches_the_reference(m, n, with_bias):
    g = torch.Generator().manual_seed(1)
    acc = torch.randint(-(1 << 20), 1 << 20, (m, n), generator=g, dtype=torch.int32)
    sx, sw = torch.rand(m, generator=g) / 100, torch.rand(n, generator=g) / 100
    bias = torch.randn(n, generator=g).bfloat16() if with_bias else None
    assert torch.equal(int8.dequant_rows(acc, sx, sw, bias, torch.bfloat16),
                       int8.dequant_ref(acc, sx, sw, bias, torch.bfloat16))


@pytest.mark.parametrize("product", ["int_mm", "own", "split", "int32"])
@pytest.mark.parametrize("m,k", [(1, 1536), (37, 1536), (5, 100)])
def test_the_int32_product_is_exact_in_every_form(product, m, k, monkeypatch):
    """One ``_int_mm`` (where the gate says it is exact); where it would saturate (oneDNN without VNNI) the
    C product, or the weight in two parts; or torch's int32 product. Values at the ends of the range, which
    saturate a 16-bit pair sum; K with a tail past the 32-byte vectors."""
    if product in ("int_mm", "split") and not int8.int_mm_available():
        pytest.skip("torch._int_mm does not run here")
    if product == "int_mm" and not int8.int_mm_exact():
        pytest.skip("one torch._int_mm saturates on this CPU (no VNNI)")
    if product == "own" and not int8.kernels_available():
        pytest.skip("needs AVX2 and a C compiler")
    monkeypatch.setattr(int8, "int_mm_available", lambda: product in ("int_mm", "split"))
    monkeypatch.setattr(int8, "int_mm_exact", lambda: product == "int_mm")
    monkeypatch.setattr(int8, "kernels_available", lambda: product == "own")
    g = torch.Generator().manual_seed(2)
    a = torch.randint(-127, 128, (m, k), generator=g, dtype=torch.int8)
    a[0, :64] = 127
    w = torch.randint(-127, 128, (200, k), generator=g, dtype=torch.int8)
    w[:, 0] = 127  # every channel reaches the full range: scale 1, the int8 weight is w itself
    w[:8, :64] = 127  # 255 x 127 twice, after oneDNN's shift of a to unsigned bytes: past int16
    w[8:16, :64] = -127
    weight = int8.Int8Weight(w.float())
    assert (weight.halves is not None) == (product == "split")
    assert torch.equal(weight.q_t.t(), w)
    acc, _ = weight.product_quantized(a, torch.ones(m))
    assert acc.dtype == torch.int32 and torch.equal(acc.long(), a.long() @ w.t().long())


def test_the_c_product_writes_into_a_given_buffer_strided_or_not(monkeypatch):
    if not int8.kernels_available():
        pytest.skip("needs AVX2 and a C compiler")
    monkeypatch.setattr(int8, "int_mm_exact", lambda: False)
    g = torch.Generator().manual_seed(3)
    a = torch.randint(-127, 128, (6, 96), generator=g, dtype=torch.int8)
    w = torch.randint(-127, 128, (40, 96), generator=g, dtype=torch.int8)
    w[:, 0] = 127
    weight = int8.Int8Weight(w.float())
    want = a.int() @ w.t().int()
    for out in (torch.empty(6, 40, dtype=torch.int32), torch.empty(6, 80, dtype=torch.int32)[:, ::2]):
        assert weight._int_mm(a, out=out) is out and torch.equal(out, want)


def test_the_split_parts_are_narrow_and_exact():
    q = torch.arange(-127, 128, dtype=torch.int8)
    hi, lo = int8.split(q)
    assert torch.equal(hi.int() * int8.SPLIT + lo.int(), q.int())
    assert lo.abs().max() <= int8.SPLIT // 2 and hi.abs().max() <= 2


def test_the_exactness_probe_sees_what_the_gate_says():
    from actorserve.kernels import capability

    if not int8.int_mm_available():
        pytest.skip("torch._int_mm does not run here")
    paths = capability.current()
    if paths.isa == paths.hardware_isa:  # no override: the gate is the probe of this process's oneDNN
        assert paths.int_mm_exact == capability._int_mm_exact()
    a = torch.full((32, 64), 127, dtype=torch.int8)
    exact = torch.equal(torch._int_mm(a, a.t().contiguous()), torch.full((32, 32), 64 * 127 * 127, dtype=torch.int32))
    if not exact:  # this process's oneDNN saturates (no VNNI, or held below it): the gate must know
        assert not paths.int_mm_exact


@pytest.mark.parametrize("m", [1, 5, 64, 300])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_int8_linear_approximates_the_float_product(m, dtype):
    g = torch.Generator().manual_seed(m)
    w, b = torch.randn(96, 576, generator=g), torch.randn(96, generator=g)
    x = torch.randn(m, 576, generator=g).to(dtype)
    weight = int8.Int8Weight(w)
    y = weight.apply(x, b.to(dtype))
    assert y.dtype == dtype and y.shape == (m, 96)
    exact = F.linear(x.double(), w.double(), b.double())
    # one int8 step of x and of w per element: about 1/127 of the rows' largest values, summed over K
    scale = x.double().abs().amax(-1, keepdim=True) * w.double().abs().amax(-1) * 576 ** 0.5 / 127
    assert ((y.double() - exact).abs() / scale).max() < 1.0
    assert (y.double() - exact).abs().max() / exact.abs().max() < 0.02
    q, sx = int8.quantize_ref(x)  # and it is exactly the scheme of the module docstring
    assert torch.equal(y, int8.dequant_ref((q.long() @ weight.q_t.long()).int(), sx, weight.scale, b.to(dtype), dtype))


def test_leading_dims_empty_input_and_errors():
    weight = int8.Int8Weight(torch.randn(32, 48))
    x = torch.randn(2, 5, 48).bfloat16()
    assert torch.equal(weight.apply(x), weight.apply(x.reshape(10, 48)).view(2, 5, 32))
    assert weight.apply(torch.randn(0, 48).bfloat16()).shape == (0, 32)
    assert linear(x, None, None, weight).shape == (2, 5, 32)
    with pytest.raises(ValueError, match="48 features"):
        weight.apply(torch.randn(2, 40).bfloat16())
    with pytest.raises(ValueError, match="floating-point CPU matrix"):
        int8.Int8Weight(torch.randn(4))


@pytest.mark.parametrize("tied", [False, True])
def test_quantized_model_holds_int8_layers_and_stays_close(tied, tmp_path):
    """quantization="int8" quantizes the layers' linears from the fp32 weights; the embedding and the lm_head
    keep the model's dtype; the layers' outputs stay within int8's error of the unquantized model's."""
    from actorserve.runtime.model.weights import loader

    directory = save_tiny_model("llama", tmp_path / "m", seed=3, tie_word_embeddings=tied)
    quant = loader.load_model(str(directory), "bfloat16", skip_tokenizer=True, quantization="int8").model
    plain = loader.load_model(str(directory), "float32", skip_tokenizer=True).model
    layers = [m for m in quant.model.modules() if isinstance(m, Linear)]
    assert layers and all(m.weight is None and isinstance(m.packed, int8.Int8Weight) for m in layers)
    assert quant.model.embed_tokens.weight.dtype == torch.bfloat16
    if not tied:
        assert not isinstance(quant.lm_head.packed, int8.Int8Weight)
    assert quant.num_parameters() == plain.num_parameters()
    hidden = torch.randn(33, plain.cfg.hidden_size, generator=torch.Generator().manual_seed(0))
    want = plain.model.layers["0"].mlp(hidden)
    got = quant.model.layers["0"].mlp(hidden.bfloat16()).float()
    assert (got - want).abs().max() / want.abs().max() < 0.05
    assert torch.nn.functional.cosine_similarity(got.flatten(), want.flatten(), dim=0) > 0.999


def test_an_unknown_quantization_is_refused(tmp_path):
    from actorserve.runtime.resolve import engine_config
    from actorserve.runtime.errors import ModelLoadError
    from actorserve.runtime.model.weights import loader

    with pytest.raises(ValueError, match="quantization must be one of"):
        engine_config(None, quantization="int4")
    directory = save_tiny_model("llama", tmp_path / "m")
    with pytest.raises(ModelLoadError, match="quantization must be one of"):
        loader.load_model(str(directory), "bfloat16", skip_tokenizer=True, quantization="fp8")


@needs_kernels
@pytest.mark.parametrize("m,n", [(1, 576), (3, 17), (300, 576), (2048, 64)])
@pytest.mark.parametrize("with_bias", [False, True])
def test_fused_seam_is_dequant_add_norm_quantize(m, n, with_bias):
    """One pass equals dequant_rows, then the elementwise add_rms_norm, then quantize_rows, to the bit."""
    g = torch.Generator().manual_seed(m + n)
    acc = torch.randint(-(1 << 16), 1 << 16, (m, n), generator=g, dtype=torch.int32)
    sx, sw = torch.rand(m, generator=g) / 100, torch.rand(n, generator=g) / 100
    bias = torch.randn(n, generator=g).bfloat16() if with_bias else None
    residual, weight = rows(m, n, seed=2), (torch.rand(n, generator=g) + 0.5).bfloat16()
    before = residual.clone()
    h, q, s = int8.dequant_add_norm_quantize(acc, sx, sw, bias, residual, weight, 1e-5)
    h_ref, q_ref, s_ref = int8.dequant_add_norm_quantize_ref(acc, sx, sw, bias, residual, weight, 1e-5)
    assert torch.equal(h, h_ref) and torch.equal(q, q_ref) and torch.equal(s, s_ref)
    assert torch.equal(residual, before) and not torch.equal(h, residual)  # h is the new stream


@pytest.mark.parametrize("m,n", [(1, 1536), (3, 17), (300, 1536), (2048, 64)])
def test_fused_silu_mul_quantize_is_the_three_passes(m, n):
    g = torch.Generator().manual_seed(m)
    acc = torch.randint(-(1 << 16), 1 << 16, (m, 2 * n), generator=g, dtype=torch.int32)
    sx, sw = torch.rand(m, generator=g) / 100, torch.rand(2 * n, generator=g) / 100
    q, s = int8.silu_mul_quantize(acc, sx, sw, torch.bfloat16)
    q_ref, s_ref = int8.silu_mul_quantize_ref(acc, sx, sw, torch.bfloat16)
    assert torch.equal(q, q_ref) and torch.equal(s, s_ref)
    # and the reference is what it says: dequantize, SiLU(gate) * up, quantize
    h = F.silu(int8.dequant_ref(acc[:, :n], sx, sw[:n], None, torch.bfloat16)) * \
        int8.dequant_ref(acc[:, n:], sx, sw[n:], None, torch.bfloat16)
    assert torch.equal(q_ref, int8.quantize_ref(h)[0])


def test_int8_mlp_fuses_the_middle_and_equals_the_unfused_layers(tmp_path):
    from actorserve.runtime.model.weights import loader

    directory = save_tiny_model("llama", tmp_path / "m", seed=5)
    model = loader.load_model(str(directory), "bfloat16", skip_tokenizer=True, quantization="int8").model
    mlp = model.model.layers["0"].mlp
    x = torch.randn(2, 19, model.cfg.hidden_size, generator=torch.Generator().manual_seed(0)).bfloat16()
    unfused = mlp.down_proj.packed.apply(silu_mul_ref(mlp.gate_up_proj.packed.apply(x)))
    assert torch.equal(mlp(x), unfused)
    assert mlp(x[:, :0]).shape == (2, 0, model.cfg.hidden_size)

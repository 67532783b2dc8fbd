"""The q8 products (GGUF weights by int8-quantized activations): the repacked layout keeps the reference
decoder's weights, and a product, of any block type (repacked or as stored), is the exact product of the
reference's weights with the activations as the q8 quantization rounds them (per block of 32: d = max|x|
/ 127, q = round(x / d)), up to the order of the sums; under the AVX2 gate as natively."""
import pytest
import torch
from torch.nn import functional as F

from actorserve.kernels.gemm import gguf, gguf_q8
from actorserve.kernels.gemm.gguf import GgufWeight, Segment
from tests.kernels.gemm.test_gguf import blocks, fused, reference

pytestmark = pytest.mark.skipif(not (gguf.available() and gguf_q8.available()),
                                reason="needs a CPU with AVX2 and a C compiler")


def q8_rounded(x: torch.Tensor) -> torch.Tensor:
    """The activations as the q8 quantization leaves them."""
    blocks_ = x.reshape(*x.shape[:-1], -1, 32)
    d = blocks_.abs().amax(-1, keepdim=True) / 127
    inv = torch.where(d > 0, 1 / d, torch.zeros_like(d))
    return ((blocks_ * inv).clamp(-127, 127).round() * d).reshape(x.shape)


def assert_q8_product(out, x, dense, bias=None):
    xq = q8_rounded(x)
    k = x.shape[-1]
    bound = 4 * k * 2.0 ** -24 * (F.linear(xq.abs(), dense.abs()) + (0 if bias is None else bias.abs())) + 1e-30
    assert ((out - F.linear(xq, dense, bias)).abs() <= bound).all()


# a repacked record's bytes for 32 values of a row, where they are not the file's: the scales widened to fp32
WIDENED = {"MXFP4": 20, "IQ4_XS": 20, "Q4_K": 24, "Q5_K": 28, "Q6_K": 32}


@pytest.mark.parametrize("type_name", gguf_q8.Q8_TYPES)
def test_the_repacked_layout_keeps_the_reference_bits(type_name):
    k, n = 96 if gguf.TYPES[type_name][1] == 32 else 512, 37  # a last group of 5 rows
    b = blocks(type_name, n, k)
    w = gguf_q8.GgufQ8Weight(GgufWeight([Segment(type_name, b, 0, n)], k))
    ref = reference(type_name, b, n, k)
    assert torch.equal(w.dequantize(), ref)
    ids = torch.tensor([[36, 0], [16, 16]])
    assert torch.equal(w.rows(ids), ref[ids])
    with pytest.raises(IndexError, match="37 rows"):
        w.rows(torch.tensor([37]))
    _, values, nbytes = gguf.TYPES[type_name]
    assert w.nbytes == 48 * k // 32 * WIDENED.get(type_name, nbytes * 32 // values)  # rows padded to 16


@pytest.mark.parametrize("type_name", sorted(gguf.TYPES))
@pytest.mark.parametrize("m", [1, 3, 8, 9, 40])
def test_products_are_the_exact_product_of_the_rounded_activations(type_name, m):
    n, k = 300, 768
    b = blocks(type_name, n, k, seed=m)
    w = gguf_q8.GgufQ8Weight(GgufWeight([Segment(type_name, b, 0, n)], k))
    dense = reference(type_name, b, n, k)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m))
    x[0, :32] *= 1e3  # one block far larger than the rest: its scale is its own
    x[-1, 32:64] = 0.0  # an all-zero block
    bias = torch.randn(n, generator=torch.Generator().manual_seed(99))
    for bb in (None, bias):
        out = w.apply(x, bb)
        assert_q8_product(out, x, dense, bb)
        exact = F.linear(x, dense, bb)  # and near the exact product: the rounding of 8-bit activations
        assert (out - exact).norm() <= 0.02 * exact.norm()


@pytest.mark.parametrize("parts", [[("Q4_1", 5), ("Q8_0", 19), ("Q4_0", 70)],  # the repacked kernel alone
                                   [("Q5_0", 70), ("Q8_0", 19), ("Q4_K", 5)],  # the row kernel first, then both
                                   [("Q8_0", 9), ("IQ4_XS", 30), ("Q6_K", 20)]])
def test_segments_of_several_types_share_one_quantization_of_the_rows(parts):
    k = 256
    segments, dense = fused(parts, k)
    w = gguf_q8.GgufQ8Weight(GgufWeight(segments, k))
    assert w.out_features == dense.shape[0] and torch.equal(w.dequantize(), dense)
    x = torch.randn(2, 3, k)
    out = w.apply(x)
    assert out.shape == (2, 3, dense.shape[0])
    assert_q8_product(out, x, dense)
    into = w.rows_product(None, torch.float32).into  # the decode plan's call, by pointer
    rows, got = x.reshape(6, k).contiguous(), torch.full((6, dense.shape[0]), float("nan"))
    into(rows.data_ptr(), got.data_ptr(), 6, 2)
    assert torch.equal(got, out.reshape(6, -1))


def test_every_type_is_taken_the_non_repacked_as_stored_and_bad_inputs_are_refused():
    stored = blocks("Q3_K", 4, 256)
    w = gguf_q8.GgufQ8Weight(GgufWeight([Segment("Q3_K", stored, 0, 4)], 256))
    assert w.parts[0].packed.data_ptr() == stored.data_ptr() and w.nbytes == stored.numel()
    w = gguf_q8.GgufQ8Weight(GgufWeight([Segment("Q8_0", blocks("Q8_0", 4, 64), 0, 4)], 64))
    with pytest.raises(ValueError, match="fp32 input of 64"):
        w.apply(torch.randn(1, 64).bfloat16())
    assert w.apply(torch.randn(0, 64)).shape == (0, 4)
    inf = torch.full((1, 64), float("inf"))
    assert w.apply(inf).shape == (1, 4)  # defined (bounded quants), not a crash

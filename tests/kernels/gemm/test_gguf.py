"""GGUF blocks computed as stored: the kernel's weights are the reference decoder's bits (and gguf-py's),
and its products are the dense fp32 product's up to the order of each sum."""
import numpy as np
import pytest
import torch
from torch.nn import functional as F

from actorserve.kernels.gemm import gguf
from actorserve.kernels.gemm.gguf import GgufWeight, Segment
from actorserve.runtime.model.weights.gguf_dequant import dequantize, dequantize_ref

pytestmark = pytest.mark.skipif(not gguf.available(), reason="needs a CPU with AVX2 and a C compiler")


def blocks(type_name: str, rows: int, k: int, seed: int = 0) -> torch.Tensor:
    """Random blocks of a type: random quants and sub-block scales, fp16 scales (and minima) of either
    sign, some of them subnormal."""
    _, values, nbytes = gguf.TYPES[type_name]
    g = np.random.default_rng(seed)
    n = rows * (k // values)
    raw = g.integers(0, 256, size=(n, nbytes), dtype=np.uint8)
    scales = (g.standard_normal((n, 2)) * 0.05).astype(np.float16)
    scales[::7, 0] = np.float16(1e-7)
    for i, offset in enumerate(SCALES_AT.get(type_name, [0])):
        raw[:, offset:offset + 2] = scales[:, i:i + 1].view(np.uint8)
    if type_name == "MXFP4":  # its e8m0 scale: 2^(e - 128), the subnormal e of 0 and 1 among them
        raw[:, 0] = g.integers(100, 140, size=n)
        raw[::5, 0] = 0
        raw[1::5, 0] = 1
    return torch.from_numpy(raw.reshape(rows, -1).copy())


# where a block's fp16 scales (d, then m or dmin) are, by type; the others' d is at 0, MXFP4's none
SCALES_AT = {"Q6_K": [208], "Q4_1": [0, 2], "Q5_1": [0, 2], "Q4_K": [0, 2], "Q5_K": [0, 2], "Q2_K": [80, 82],
             "Q3_K": [108], "MXFP4": []}


def assert_same_up_to_sum_order(out, x, dense, bias=None):
    """Two fp32 sums of the same k products differ by at most 2 k u times the sum of their magnitudes."""
    k = x.shape[-1]
    bound = 2 * k * 2.0 ** -24 * (F.linear(x.abs(), dense.abs()) + (0 if bias is None else bias.abs()))
    assert ((out - F.linear(x, dense, bias)).abs() <= bound).all()


def reference(type_name: str, b: torch.Tensor, rows: int, k: int) -> torch.Tensor:
    """The weights as gguf-py decodes them (the loader's own ``dequantize`` runs this kernel's decoder)."""
    return dequantize_ref(b.numpy().reshape(-1), type_name, (rows, k))


@pytest.mark.parametrize("type_name", sorted(gguf.TYPES))
def test_the_kernel_decodes_the_reference_bits(type_name):
    k = 96 if gguf.TYPES[type_name][1] == 32 else 512
    b = blocks(type_name, 37, k)
    w = GgufWeight([Segment(type_name, b, 0, 37)], k)
    ref = reference(type_name, b, 37, k)
    assert torch.equal(w.dequantize(), ref)
    assert torch.equal(dequantize(b.numpy().reshape(-1), type_name, (37, k)), ref)  # and the loader's
    ids = torch.tensor([[36, 0], [5, 5]])
    assert torch.equal(w.rows(ids), ref[ids])  # an embedding lookup decodes just those rows
    with pytest.raises(IndexError, match="37 rows"):
        w.rows(torch.tensor([37]))


@pytest.mark.parametrize("type_name", sorted(gguf.TYPES))
@pytest.mark.parametrize("m", [1, 3, 8, 9, 40])  # kernel, kernel in passes of 8, decoded tiles
def test_products_match_the_dense_fp32_product(type_name, m):
    n, k = 300, 768
    b = blocks(type_name, n, k, seed=m)
    w = GgufWeight([Segment(type_name, b, 0, n)], k)
    dense = reference(type_name, b, n, k)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m))
    bias = torch.randn(n, generator=torch.Generator().manual_seed(99))
    for bb in (None, bias):
        assert_same_up_to_sum_order(w.apply(x, bb), x, dense, bb)


@pytest.mark.parametrize("type_name", sorted(gguf.TYPES))
def test_the_products_weights_are_the_reference_bits(type_name):
    """Rows of x that pick one column each give that column's weights exactly: the product (at every row
    count the kernel takes) decodes each weight to the reference's value, which a bound on the sum's
    rounding would not tell (a sum of one product and zeros has no rounding of its own)."""
    n, k = 70, 768
    b = blocks(type_name, n, k, seed=5)
    w = GgufWeight([Segment(type_name, b, 0, n)], k)
    dense = reference(type_name, b, n, k)
    cols = torch.tensor([0, 1, 31, 32, 200, 255, 256, 767])
    for m in range(1, 9):
        x = torch.zeros(m, k)
        x[torch.arange(m), cols[:m]] = 1.0
        assert torch.equal(w.apply(x), dense[:, cols[:m]].T)


def fused(parts: list[tuple[str, int]], k: int) -> tuple[list[Segment], torch.Tensor]:
    """Segments of random blocks of these (type, rows) in order, and the dense matrix they stand for."""
    segments, dense, at = [], [], 0
    for i, (t, rows) in enumerate(parts):
        b = blocks(t, rows, k, seed=i)
        segments.append(Segment(t, b, at, rows))
        dense.append(reference(t, b, rows, k))
        at += rows
    return segments, torch.cat(dense)


def test_segments_of_different_types_make_one_fused_weight():
    k = 64
    segments, dense = fused([("Q4_1", 5), ("Q8_0", 3), ("Q4_0", 70)], k)
    w = GgufWeight(segments, k)
    assert w.out_features == 78 and torch.equal(w.dequantize(), dense)
    x = torch.randn(2, 3, k)
    assert_same_up_to_sum_order(w.apply(x), x, dense)
    assert w.apply(x).shape == (2, 3, 78)


def test_bad_segments_and_inputs_are_refused():
    b = blocks("Q8_0", 4, 64)
    with pytest.raises(ValueError, match="in order"):
        GgufWeight([Segment("Q8_0", b, 1, 4)], 64)
    with pytest.raises(ValueError, match="in order"):
        GgufWeight([Segment("Q8_0", b, 0, 4)], 96)
    w = GgufWeight([Segment("Q8_0", b, 0, 4)], 64)
    with pytest.raises(ValueError, match="fp32 input of 64"):
        w.apply(torch.randn(1, 64).bfloat16())
    with pytest.raises(ValueError, match="fp32 input of 64"):
        w.apply(torch.randn(1, 32))

"""The fused row kernels against torch's sequences (the references): in bf16 they match bit for bit on
these inputs, in fp32 up to the order of a norm's sum and exp's last bit (rotary exactly); row by row,
so a row's result does not depend on the batch around it."""
import pytest
import torch

from actorserve.kernels.elementwise import (argmax, cpu_rows, rms_norm, rms_norm_ref, rotary, rotary_ref, silu_mul,
                                            silu_mul_ref)

pytestmark = pytest.mark.skipif(not cpu_rows.available(), reason="needs a CPU with AVX2 and a C compiler")

SHAPES = [(1, 576), (3, 100), (7, 17), (300, 576), (2048, 64)]  # tails of the 16-lane loops; both thread paths


def inputs(rows, n, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(rows, n, generator=g) * 3).bfloat16()
    d = torch.randn(rows, n, generator=g).bfloat16()
    w = (torch.rand(n, generator=g) + 0.5).bfloat16()
    return x, d, w


@pytest.mark.parametrize("rows,n", SHAPES)
def test_rms_norm_matches_torch(rows, n):
    x, d, w = inputs(rows, n)
    assert torch.equal(cpu_rows.rms_norm(x, w, 1e-5), rms_norm_ref(x, w, 1e-5))
    h, y = cpu_rows.add_rms_norm(x, d, w, 1e-6)
    assert torch.equal(h, x + d)
    assert torch.equal(y, rms_norm_ref(x + d, w, 1e-6))


@pytest.mark.parametrize("rows,n", SHAPES)
def test_silu_mul_matches_torch(rows, n):
    gu = (torch.randn(rows, 2 * n, generator=torch.Generator().manual_seed(1)) * 4).bfloat16()
    gu[0, :3] = torch.tensor([-100.0, 100.0, 0.0])  # exp's clamps
    assert torch.equal(cpu_rows.silu_mul(gu), silu_mul_ref(gu))


def test_a_row_is_the_same_alone_as_in_a_batch():
    x, d, w = inputs(400, 576, seed=2)
    assert torch.equal(cpu_rows.add_rms_norm(x, d, w, 1e-5)[1][-1:], cpu_rows.add_rms_norm(x[-1:], d[-1:], w, 1e-5)[1])


def test_leading_dims_dispatch_and_errors():
    x, d, w = inputs(6, 64)
    x3 = x.view(2, 3, 64)
    assert torch.equal(rms_norm(x3, w, 1e-5), rms_norm_ref(x3, w, 1e-5))
    assert torch.equal(silu_mul(x3), silu_mul_ref(x3))
    assert not cpu_rows.applies(x.half(), w.half())  # no fp16 build: fp16 takes torch's path
    with pytest.raises(ValueError, match="weight of shape"):
        cpu_rows.rms_norm(x, w[:10], 1e-5)
    with pytest.raises(ValueError, match="even last dimension"):
        cpu_rows.silu_mul(x[:, :5])


needs_fp32 = pytest.mark.skipif(not cpu_rows.available(torch.float32), reason="no fp32 build here")


@needs_fp32
@pytest.mark.parametrize("rows,n", SHAPES)
def test_fp32_rows_match_torch_to_rounding(rows, n):
    x, d, w = (t.float() for t in inputs(rows, n, seed=5))
    x = x + torch.randn(rows, n, generator=torch.Generator().manual_seed(6)) * 1e-3  # not bf16 values
    tight = dict(rtol=2e-6, atol=1e-6)
    torch.testing.assert_close(cpu_rows.rms_norm(x, w, 1e-5), rms_norm_ref(x, w, 1e-5), **tight)
    h, y = cpu_rows.add_rms_norm(x, d, w, 1e-6)
    assert torch.equal(h, x + d)
    torch.testing.assert_close(y, rms_norm_ref(x + d, w, 1e-6), **tight)
    gu = torch.cat([x * 4, d], dim=1)
    gu[0, :3] = torch.tensor([-100.0, 100.0, 0.0])
    torch.testing.assert_close(cpu_rows.silu_mul(gu), silu_mul_ref(gu), **tight)
    assert cpu_rows.applies(x, w)  # the module path takes the fp32 build
    assert torch.equal(rms_norm(x, w, 1e-5), cpu_rows.rms_norm(x, w, 1e-5))


@pytest.mark.parametrize("t,heads,d", [(1, 12, 64), (5, 4, 48), (300, 12, 64), (3, 2, 40), (2, 2, 128)])
def test_rotary_matches_torch_on_strided_rows(t, heads, d):
    """q and k are read where they lie in the fused qkv output; D/2 not a multiple of 16 (48, 40) takes
    the path where a vector straddles the middle."""
    g = torch.Generator().manual_seed(t)
    qkv = torch.randn(t, (heads + 3) * d, generator=g).bfloat16()
    x = qkv[:, :heads * d].view(t, heads, d)
    table = (torch.randn(t, 1, d, generator=g).bfloat16(), torch.randn(t, 1, d, generator=g).bfloat16())
    assert cpu_rows.rotary_applies(x, *table)
    assert torch.equal(rotary(x, table), rotary_ref(x, table))
    xf, tf = x.float(), tuple(c.float() for c in table)
    assert cpu_rows.rotary_applies(xf, *tf) == cpu_rows.available(torch.float32)
    assert torch.equal(rotary(xf, tf), rotary_ref(xf, tf))  # two products and a sum, rounded as torch does


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("rows,n", [(1, 1), (4, 15), (4, 16), (5, 17), (256, 49152)])
def test_argmax_matches_torch(rows, n, dtype):
    if not cpu_rows.available(dtype):
        pytest.skip(f"no C kernels for {dtype} here")
    x = torch.randint(-3, 3, (rows, n), generator=torch.Generator().manual_seed(3)).to(dtype)  # many ties
    assert torch.equal(cpu_rows.argmax(x), x.argmax(dim=-1))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_the_samplers_argmax_takes_the_c_pass(dtype, monkeypatch):
    if not cpu_rows.available(dtype):
        pytest.skip(f"no C kernels for {dtype} here")
    taken = []
    monkeypatch.setattr(cpu_rows, "argmax", lambda x, _c=cpu_rows.argmax: taken.append(x.dtype) or _c(x))
    x = torch.randn(3, 1000, generator=torch.Generator().manual_seed(5)).to(dtype)
    assert torch.equal(argmax(x), x.argmax(dim=-1)) and taken == [dtype]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_argmax_edge_values_match_torch(dtype):
    if not cpu_rows.available(dtype):
        pytest.skip(f"no C kernels for {dtype} here")
    x = torch.randn(8, 37, generator=torch.Generator().manual_seed(4)).to(dtype)
    x[0] = float("-inf")  # all -inf: index 0
    x[1, 5], x[1, 9] = float("nan"), float("nan")  # the first NaN wins
    x[2], x[2, 7] = -0.0, 0.0  # equal zeros: the first
    x[3, 20] = float("inf")
    x[4], x[4, 36] = float("-inf"), -1e30  # the maximum in the tail of the last vector
    x[5, 33] = 100.0
    assert cpu_rows.argmax(x).tolist() == x.argmax(dim=-1).tolist() == [0, 5, 0, 20, 36, 33] + x[6:].argmax(-1).tolist()

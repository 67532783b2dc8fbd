"""The skinny bf16 GEMM against an fp64 product and against torch's own bf16 product."""
from __future__ import annotations

import pytest
import torch
from torch.nn import functional as F

from actorserve.kernels import native
from actorserve.kernels.gemm import linear, skinny

needs_kernel = pytest.mark.skipif(not skinny.available(), reason="needs a C compiler and a CPU with AVX2")


def _case(m, k, n, bias, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g).bfloat16()
    w = (torch.randn(n, k, generator=g) / k ** 0.5).bfloat16()
    b = torch.randn(n, generator=g).bfloat16() if bias else None
    return x, w, b


@needs_kernel
@pytest.mark.parametrize("m,k,n,bias", [
    (1, 576, 960, False), (1, 576, 49152, False), (3, 1536, 576, True), (8, 576, 3072, False),
    (5, 100, 37, True),   # K not a multiple of 32, N not a multiple of the row block
    (2, 33, 9, False), (1, 16, 1, True), (7, 64, 8, False)])
def test_matches_fp64_product_within_one_bf16_rounding(m, k, n, bias):
    x, w, b = _case(m, k, n, bias)
    exact = F.linear(x.double(), w.double(), None if b is None else b.double())
    got = skinny.skinny_linear(x, w, b)
    assert got.dtype == torch.bfloat16 and got.shape == (m, n)
    # fp32 accumulation, then one rounding to bf16: within one bf16 ulp (2^-8 relative) of the exact value
    tol = exact.abs() * 2 ** -8 + 1e-3
    assert ((got.double() - exact).abs() <= tol).all()
    torch_bf16 = F.linear(x, w, b)
    assert (got != torch_bf16).float().mean() < 0.01  # the same values as torch's bf16 path, but for ties


@needs_kernel
def test_takes_any_leading_shape_and_strides():
    x, w, _ = _case(6, 128, 40, False)
    x3 = x.view(2, 3, 128)
    assert torch.equal(skinny.skinny_linear(x3, w), skinny.skinny_linear(x, w).view(2, 3, 40))
    xt = x.t().contiguous().t()  # same values, column-major
    assert torch.equal(skinny.skinny_linear(xt, w), skinny.skinny_linear(x, w))
    assert skinny.skinny_linear(x[:0], w).shape == (0, 40)


@needs_kernel
def test_gate_sends_only_skinny_bf16_products():
    x, w, b = _case(skinny.MAX_ROWS, 64, 16, True)
    assert skinny.applies(x, w, b)
    assert not skinny.applies(torch.cat([x, x[:1]]), w)          # more rows than MAX_ROWS: oneDNN's GEMM
    assert not skinny.applies(x.float(), w.float())               # fp32 stays on torch (held exact)
    assert not skinny.applies(x, w.t().contiguous().t())          # a weight that is not row-major
    assert not skinny.applies(x, w, b.float())
    narrow = torch.randn(16, 32).bfloat16()
    assert not skinny.applies(x, narrow)                          # shapes must agree, else torch says why
    with pytest.raises(RuntimeError):
        linear(x, narrow)


def test_linear_is_torch_where_the_gate_says_no():
    x, w, b = _case(12, 64, 16, True)
    assert torch.equal(linear(x, w, b), F.linear(x, w, b))
    assert torch.equal(linear(x.float(), w.float()), F.linear(x.float(), w.float()))


def test_native_build_caches_and_reports_a_failed_build(tmp_path, monkeypatch):
    if native.compiler() is None:
        pytest.skip("no C compiler")
    monkeypatch.setenv("ACTORSERVE_KERNEL_CACHE", str(tmp_path / "cache"))
    good = tmp_path / "good.c"
    good.write_text("int twice(int x) { return 2 * x; }\n")
    lib = native.load(good, ["-O2"])
    assert lib is not None and lib.twice(21) == 42
    built = list((tmp_path / "cache").iterdir())
    assert len(built) == 1
    assert native.load(good, ["-O2"]) is not None and list((tmp_path / "cache").iterdir()) == built  # reused
    assert native.load(good, ["-O1"]) is not None and len(list((tmp_path / "cache").iterdir())) == 2  # new flags
    bad = tmp_path / "bad.c"
    bad.write_text("this is not C\n")
    assert native.load(bad, ["-O2"]) is None

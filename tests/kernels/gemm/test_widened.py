"""bf16 products widened to fp32, for CPUs without a bf16 GEMM: against an fp64 product, and the gate that
sends bf16 products of many rows there."""
from __future__ import annotations

import dataclasses

import pytest
import torch
from torch.nn import functional as F

from actorserve.kernels import capability
from actorserve.kernels.gemm import linear, skinny, widened
from tests.kernels.gemm.test_skinny import _case  # bf16 rows, a weight scaled by 1/sqrt(k), a bias


@pytest.mark.parametrize("m,k,n,bias,slab", [
    (64, 576, 1536, False, None), (33, 100, 37, True, 1000), (9, 64, 300, True, 64 * 7), (4, 16, 5, False, 1)])
def test_matches_fp64_product_within_one_bf16_rounding(m, k, n, bias, slab, monkeypatch):
    if slab is not None:  # slabs narrower than the weight, one of them ragged
        monkeypatch.setattr(widened, "SLAB_ELEMENTS", slab)
    x, w, b = _case(m, k, n, bias)
    exact = F.linear(x.double(), w.double(), None if b is None else b.double())
    got = widened.widened_linear(x, w, b)
    assert got.dtype == torch.bfloat16 and got.shape == (m, n)
    tol = exact.abs() * 2 ** -8 + 1e-3  # fp32 sums, one rounding to bf16
    assert ((got.double() - exact).abs() <= tol).all()
    assert torch.equal(got, F.linear(x.float(), w.float(), None if b is None else b.float()).bfloat16())


def test_takes_any_leading_shape_and_no_rows():
    x, w, b = _case(12, 64, 40, True)
    assert torch.equal(widened.widened_linear(x.view(3, 4, 64), w, b), widened.widened_linear(x, w, b).view(3, 4, 40))
    assert widened.widened_linear(x[:0], w).shape == (0, 40)


@pytest.fixture
def no_bf16_gemm():
    before = capability.current()
    capability.use(dataclasses.replace(before, bf16_gemm=False))
    yield
    capability.use(before)


def test_without_a_bf16_gemm_bf16_products_past_the_skinny_kernel_are_widened(no_bf16_gemm, monkeypatch):
    calls = []
    real = widened.widened_linear
    monkeypatch.setattr(widened, "widened_linear", lambda *a: calls.append(a[0].shape) or real(*a))
    x, w, b = _case(skinny.MAX_ROWS + 1, 64, 48, True)
    linear(x, w, b)
    assert calls == [x.shape]
    linear(x.float(), w.float(), b.float())  # fp32 stays on torch
    linear(x[:widened.MIN_ROWS - 1], w, b)  # too few rows to repay the widening: the skinny kernel, or torch
    assert calls == [x.shape]
    linear(x[:widened.MIN_ROWS], w, b)  # the skinny kernel where it is built, else widened
    assert len(calls) == (1 if skinny.applies(x[:widened.MIN_ROWS], w, b) else 2)


def test_with_a_bf16_gemm_nothing_is_widened():
    if not capability.current().bf16_gemm:
        pytest.skip("this CPU (or the override) has no bf16 GEMM")
    x, w, _ = _case(64, 64, 48, False)
    assert not widened.applies(x, w)

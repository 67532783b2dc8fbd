"""Sliding windows and soft caps in every CPU-testable backend: the torch backend against plain dense
attention with the window's mask (as transformers builds it: a key k is seen from position p where
p - window < k <= p), then the C kernel and the triton kernel (in its interpreter) against the torch
backend, on one step that mixes decodes, a fresh prompt and a chunk continuing a cached prefix (the triton
kernel's test, tests/kernels/attention/test_sliding_window_triton.py, shares this one's cases). The C and
triton kernels never read a block that lies wholly before a row's window, so blocks the KV manager has
freed there may hold anything: filled with NaN here, their rows stay finite and equal."""
import math

import pytest
import torch

from actorserve.kernels.attention import AttentionMetadata, TorchRefBackend
from actorserve.kernels.attention import cpu_decode
from tests.kernels.attention.groups import sequence_group, slot_mapping

KVH, H, D, BS, BLOCKS = 2, 6, 64, 4, 40
# decodes at positions 13 and 3; a fresh prompt of 6; a chunk of 5 after 10 cached tokens
DECODE = ([1, 1], [13, 3], [[3, 7, 11, 12], [5]])
PREFILL = ([6, 5], [0, 10], [[1, 2], [8, 9, 10, 14]])
CASES = [(0, 0.0), (5, 0.0), (4, 0.0), (3, 2.0), (0, 1.5), (100, 0.0)]
IDS = ["causal", "window5", "window-of-a-block", "window3+cap", "cap", "window-past-everything"]


def _step(dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    decode, prefill = sequence_group(*DECODE, 0), sequence_group(*PREFILL, 2)
    slots = slot_mapping((decode, prefill), BS)
    meta = AttentionMetadata(torch.tensor(slots), decode, prefill)
    t = len(slots)
    q = torch.randn(t, H, D, generator=g).to(dtype)
    k, v = (torch.randn(t, KVH, D, generator=g).to(dtype) for _ in range(2))
    cache = torch.randn(2, KVH, BLOCKS, BS, D, generator=g).to(dtype)  # the cached prefixes
    return meta, q, k, v, cache


def _dense(q, cache, meta, window, softcap):
    """Each query row against its sequence's keys gathered from the cache (after the step's are written),
    with the mask built from positions."""
    out = torch.empty_like(q, dtype=torch.float32)
    for grp in (meta.decode, meta.prefill):
        row = grp.token_start
        for n, c, table in zip(grp.query_lens, grp.context_lens, grp.block_tables.tolist()):
            length = c + n
            keys = torch.stack([cache[0][:, table[p // BS], p % BS] for p in range(length)], 1).float()
            values = torch.stack([cache[1][:, table[p // BS], p % BS] for p in range(length)], 1).float()
            for i in range(n):
                pos = c + i
                qs = q[row + i].float().view(KVH, H // KVH, D)
                s = torch.einsum("kgd,ktd->kgt", qs, keys) / math.sqrt(D)
                if softcap:
                    s = torch.tanh(s / softcap) * softcap
                ks = torch.arange(length)
                seen = (ks <= pos) & ((ks > pos - window) if window else True)
                s = s.masked_fill(~seen, float("-inf"))
                out[row + i] = torch.einsum("kgt,ktd->kgd", s.softmax(-1), values).reshape(H, D)
            row += n
    return out.to(q.dtype)


def _written(cache, k, v, meta):
    out = cache.clone()
    TorchRefBackend(KVH, BLOCKS, BS).forward(k.new_zeros(k.shape[0], H, D), k, v, out[0], out[1],
                                             TorchRefBackend(KVH, BLOCKS, BS).prepare(meta), 1.0)
    return out


def _poison_before_windows(cache, meta, window):
    """NaN in every block that lies wholly before every window of its sequence's rows this step."""
    poisoned = cache.clone()
    if not window:
        return poisoned, 0
    count = 0
    for grp in (meta.decode, meta.prefill):
        for n, c, table in zip(grp.query_lens, grp.context_lens, grp.block_tables.tolist()):
            first = max(0, c - window + 1)  # the earliest key any row of this sequence sees
            for j in range(first // BS):
                poisoned[:, :, table[j]] = float("nan")
                count += 1
    return poisoned, count


@pytest.mark.parametrize("window, softcap", CASES, ids=IDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_torch_backend_masks_as_transformers_does(dtype, window, softcap):
    meta, q, k, v, cache = _step(dtype)
    backend = TorchRefBackend(KVH, BLOCKS, BS)
    caches = cache.clone()
    got = backend.forward(q, k, v, caches[0], caches[1], backend.prepare(meta), D ** -0.5, window, softcap)
    expected = _dense(q, caches, meta, window, softcap)
    tol = dict(atol=1e-5, rtol=1e-4) if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(got, expected, **tol)
    if window:  # and the window changes the answer (a test that could not fail would not say much)
        plain = backend.forward(q, k, v, caches[0], caches[1], backend.prepare(meta), D ** -0.5, 0, softcap)
        assert not torch.allclose(plain, got, atol=1e-3) or window >= 14


@pytest.mark.skipif(not cpu_decode.available(torch.float32), reason="the C kernels are off on this machine")
@pytest.mark.parametrize("window, softcap", CASES, ids=IDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_c_kernel_matches_and_never_reads_before_the_window(dtype, window, softcap):
    if not cpu_decode.available(dtype):
        pytest.skip(f"no C kernel for {dtype} here")
    meta, q, k, v, cache = _step(dtype)
    ref = TorchRefBackend(KVH, BLOCKS, BS)
    ref_caches = cache.clone()
    expected = ref.forward(q, k, v, ref_caches[0], ref_caches[1], ref.prepare(meta), D ** -0.5, window, softcap)
    poisoned, count = _poison_before_windows(_written(cache, k, v, meta), meta, window)
    assert count > 0 or window in (0, 100)
    backend = cpu_decode.CpuDecodeBackend(KVH, BLOCKS, BS)
    got = backend.forward(q, k, v, poisoned[0], poisoned[1], backend.prepare(meta), D ** -0.5, window, softcap)
    assert torch.isfinite(got).all()
    tol = dict(atol=1e-5, rtol=1e-4) if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(got, expected, **tol)

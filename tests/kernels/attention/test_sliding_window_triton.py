"""The triton kernel's sliding window and soft cap, in its interpreter, against the torch backend on the
cases of tests/kernels/attention/test_sliding_window.py; the blocks wholly before a row's window hold NaN
and are never read."""
import pytest
import torch

pytest.importorskip("triton")
pytestmark = pytest.mark.triton  # a triton form: make test-isa leaves these to the first pass

from actorserve.kernels.attention import AttentionMetadata, TorchRefBackend  # noqa: E402
from tests.kernels.attention.test_sliding_window import (BLOCKS, BS, CASES, D, IDS, KVH,  # noqa: E402
                                                         _poison_before_windows, _step, _written)


@pytest.mark.parametrize("tile_elements", [None, 1], ids=["pages", "one-key-tiles"])
@pytest.mark.parametrize("window, softcap", CASES, ids=IDS)
def test_the_triton_kernel_matches_and_never_reads_before_the_window(window, softcap, tile_elements, device,
                                                                      monkeypatch):
    """One key a tile: a window's first page has tiles wholly before the window, masked whole."""
    from actorserve.kernels.attention import unified_attention_triton as unified_attention
    from actorserve.kernels.attention.unified_attention_triton import TritonAttentionBackend

    if tile_elements is not None:
        monkeypatch.setattr(unified_attention, "TILE_ELEMENTS", tile_elements)

    meta, q, k, v, cache = _step(torch.float32)
    ref = TorchRefBackend(KVH, BLOCKS, BS)
    ref_caches = cache.clone()
    expected = ref.forward(q, k, v, ref_caches[0], ref_caches[1], ref.prepare(meta), D ** -0.5, window, softcap)
    poisoned, _ = _poison_before_windows(_written(cache, k, v, meta), meta, window)
    backend = TritonAttentionBackend(KVH, BLOCKS, BS)
    to = lambda x: x.to(device)  # noqa: E731
    caches = to(poisoned)
    meta_dev = AttentionMetadata(to(meta.slot_mapping), meta.decode, meta.prefill)
    got = backend.forward(to(q), to(k), to(v), caches[0], caches[1], backend.prepare(meta_dev), D ** -0.5,
                          window, softcap).cpu()
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-4)

"""Unified paged attention against the torch backend on one step that mixes decodes, a fresh prompt and
a chunk continuing a cached prefix (GQA, a head size that is not a power of two, fp32 and bf16), and a tiny
Llama end to end through the triton backend, its logits against the torch backend's."""
import pytest
import torch

pytest.importorskip("triton")
pytestmark = pytest.mark.triton  # a triton form: make test-isa leaves these to the first pass

from actorserve.kernels.attention import AttentionMetadata, TorchRefBackend  # noqa: E402
from actorserve.kernels.attention import unified_attention_triton as unified_attention_module  # noqa: E402
from actorserve.kernels.attention.unified_attention_triton import TritonAttentionBackend  # noqa: E402
from tests.kernels.attention.groups import sequence_group, slot_mapping  # noqa: E402


@pytest.mark.parametrize("tile_elements", [None, 512, 1])  # whole pages; two keys a tile; one (a tile past pos)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_mixed_step_matches_the_torch_backend(dtype, tile_elements, device, monkeypatch):
    if tile_elements is not None:
        monkeypatch.setattr(unified_attention_module, "TILE_ELEMENTS", tile_elements)
    g = torch.Generator().manual_seed(0)
    kvh, h, d, bs, blocks = 2, 6, 40, 4, 24
    decode = sequence_group([1, 1], [9, 2], [[3, 7, 11], [5]], 0)
    prefill = sequence_group([5, 3], [0, 6], [[1, 2], [8, 9, 10]], 2)
    slots = slot_mapping((decode, prefill), bs)
    meta = AttentionMetadata(torch.tensor(slots), decode, prefill)
    t = len(slots)
    q = torch.randn(t, h, d, generator=g).to(dtype)
    k, v = (torch.randn(t, kvh, d, generator=g).to(dtype) for _ in range(2))
    cache = torch.randn(2, kvh, blocks, bs, d, generator=g).to(dtype)  # the cached prefixes: whatever is there
    ref_backend, tri_backend = TorchRefBackend(kvh, blocks, bs), TritonAttentionBackend(kvh, blocks, bs)
    ref_caches = cache.clone()
    expected = ref_backend.forward(q, k, v, ref_caches[0], ref_caches[1], ref_backend.prepare(meta), d ** -0.5)
    tri_caches = cache.clone().to(device)
    to = lambda x: x.to(device)  # noqa: E731
    meta_dev = AttentionMetadata(to(meta.slot_mapping), decode, prefill)
    got = tri_backend.forward(to(q), to(k), to(v), tri_caches[0], tri_caches[1], tri_backend.prepare(meta_dev),
                              d ** -0.5)
    tol = dict(atol=1e-5, rtol=1e-4) if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(got.cpu(), expected, **tol)
    assert torch.equal(tri_caches.cpu(), ref_caches)


def test_a_tiny_llama_through_the_triton_backend(tiny_llama_dir, device):
    """The whole model, forced onto the triton backend (in the interpreter here), against the torch
    backend: prefill then two decode steps with a prefix in the cache."""
    from actorserve.runtime.engine.sampling_params import SamplingParams
    from actorserve.runtime.transport.messages import NewRequest, ScheduledChunk, SchedulerOutput
    from actorserve.runtime.model.weights.loader import load_model
    from actorserve.runtime.model.execution.runner import ModelRunner

    model = load_model(str(tiny_llama_dir), "float32", skip_tokenizer=True, device=device).model
    spec = SamplingParams(temperature=0.0)
    logits = {}
    for name in ("torch", "triton"):
        runner = ModelRunner(model, 16, 16, fast_decode=False, attention_backend=name, device=device)
        assert type(runner.backend).__name__ == {"torch": "TorchRefBackend", "triton": "TritonAttentionBackend"}[name]
        prompt = [5, 9, 2, 77, 31, 8, 120, 4, 66, 13, 250, 7, 19, 3, 200, 41, 90, 15]
        steps = [SchedulerOutput(1, [NewRequest("a", prompt, spec)],
                                 [ScheduledChunk("a", prompt, 0, [2, 5], True)], []),
                 SchedulerOutput(2, [], [ScheduledChunk("a", [17], len(prompt), [2, 5], True)], []),
                 SchedulerOutput(3, [], [ScheduledChunk("a", [23, 29], len(prompt) + 1, [2, 5], True)], [])]
        logits[name] = [runner.forward(runner.prepare_inputs(s)) for s in steps]
    for ref, got in zip(logits["torch"], logits["triton"]):
        torch.testing.assert_close(got.cpu(), ref.cpu(), atol=1e-4, rtol=1e-4)


def test_a_decode_step_padded_into_static_buffers_gives_the_same_rows(device):
    """What a replayed CUDA graph runs: the step's plan copied into static buffers, padded to the captured
    size with rows that write no KV (slot -1) and attend their own empty sequence."""
    g = torch.Generator().manual_seed(3)
    kvh, h, d, bs, blocks = 2, 4, 32, 4, 16
    decode = sequence_group([1, 1, 1], [5, 0, 9], [[3, 4], [6], [7, 8, 9]], 0)
    slots = [4 * 4 + 1, 6 * 4, 9 * 4 + 1]
    backend = TritonAttentionBackend(kvh, blocks, bs)
    plan = backend.prepare(AttentionMetadata(torch.tensor(slots, device=device), decode, None))
    q = torch.randn(4, h, d, generator=g).to(device)
    k, v = (torch.randn(4, kvh, d, generator=g).to(device) for _ in range(2))
    cache = torch.randn(2, kvh, blocks, bs, d, generator=g).to(device)
    plain_caches, padded_caches = cache.clone(), cache.clone()
    plain = backend.forward(q[:3], k[:3], v[:3], plain_caches[0], plain_caches[1], plan, d ** -0.5)
    static = backend.static_plan(8, 5, device)
    padded_plan = backend.load_plan(static, plan, 4)
    padded = backend.forward(q, k, v, padded_caches[0], padded_caches[1], padded_plan, d ** -0.5)
    torch.testing.assert_close(padded[:3], plain)
    assert torch.equal(padded_caches, plain_caches)  # the padding row wrote nothing
    assert padded_plan.slot_mapping.tolist() == slots + [-1]

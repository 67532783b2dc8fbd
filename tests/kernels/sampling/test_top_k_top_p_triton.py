"""Top-k/top-p sampling against the CPU sampler's filter and race."""
import pytest
import torch

pytest.importorskip("triton")
pytestmark = pytest.mark.triton  # a triton form: make test-isa leaves these to the first pass

from actorserve.kernels.sampling.top_k_top_p_triton import top_k_top_p_sample  # noqa: E402
from actorserve.runtime.model.sampling.sampler import top_k_top_p_mask  # noqa: E402


def test_top_k_top_p_sampling_matches_the_sampler(device):
    g = torch.Generator().manual_seed(0)
    b, v = 24, 3000
    logits = torch.randn(b, v, generator=g) * 3
    noise = torch.empty(b, v).exponential_(generator=g)
    top_k = torch.tensor([0, 1, 5, 50, 2999, 3000] * 4)
    top_p = torch.tensor([1.0] * 6 + [0.9] * 6 + [0.5] * 6 + [0.05] * 6)
    got = top_k_top_p_sample(logits.to(device), top_k, top_p, noise.to(device)).cpu()
    masked = top_k_top_p_mask(logits, torch.where((top_k > 0) & (top_k < v), top_k, v), top_p)
    expected = (masked.softmax(dim=-1) / noise).argmax(dim=-1)
    assert torch.equal(got, expected)
    assert len(set(got.tolist())) > 12  # (the rows differ: not one token for all)
    assert got[1] == logits[1].argmax() and got[23] == logits[23].argmax()  # k = 1; a tiny p keeps the top


def test_the_sampler_takes_the_kernel_on_a_gpu(monkeypatch, device):
    """On a GPU the sampler's sampled rows go to this kernel, on the same noise: here the route is opened
    for CPU tensors too, and seeded rows give the torch path's tokens."""
    from actorserve.kernels.sampling import top_k_top_p_triton as sampling
    from actorserve.runtime.engine.sampling_params import SamplingParams
    from actorserve.runtime.model.sampling import sampler as sampler_module
    from actorserve.runtime.model.sampling.sampler import Sampler, SamplingRow, noise_stream

    specs = [SamplingParams(**{"temperature": 0.9, **kw}) for kw in (
        dict(top_k=20), dict(top_p=0.8), dict(min_p=0.05), dict(temperature=0.0), dict(top_k=5, top_p=0.5), {})]
    logits = torch.randn(len(specs), 500, generator=torch.Generator().manual_seed(5)).to(device) * 2

    def tokens():
        rows = [SamplingRow(s, noise_stream(i, "target", device), [1], []) for i, s in enumerate(specs)]
        return Sampler(device=device)(logits, rows)[0]
    monkeypatch.setattr(sampler_module, "_triton_sampling", lambda x: None)
    expected = tokens()
    monkeypatch.setattr(sampler_module, "_triton_sampling", lambda x: sampling)
    assert tokens() == expected

"""``ModelRunner.copy_blocks``, a forked beam's copy-on-write, in each backend's cache layout: the source
block's K and V land in the destination in every layer, nothing else changes."""
from types import SimpleNamespace

import pytest
import torch

from actorserve.kernels.attention.flashinfer import FlashInferBackend
from actorserve.kernels.attention.torch_ref import TorchRefBackend
from actorserve.runtime.model.execution.runner import ModelRunner


@pytest.mark.parametrize("backend", [TorchRefBackend, FlashInferBackend])
def test_blocks_are_copied_along_the_backend_s_block_dimension(backend):
    shape = backend.kv_cache_shape(6, 4, 2, 8)
    caches = [(torch.randn(shape), torch.randn(shape)) for _ in range(3)]
    latent = torch.randn(shape)
    caches.append((latent, latent))  # MLA: one pool read as K and V
    before = [(k.clone(), v.clone()) for k, v in caches]
    runner = SimpleNamespace(kv_caches=caches, device=torch.device("cpu"), backend=backend)
    ModelRunner.copy_blocks(runner, [(1, 4), (2, 5)])
    dim = backend.block_dim
    for (k, v), (k0, v0) in zip(caches, before):
        for pool, old in ((k, k0), (v, v0)):
            for src, dst in ((1, 4), (2, 5)):
                assert torch.equal(pool.select(dim, dst), old.select(dim, src))
            for untouched in (0, 1, 2, 3):
                assert torch.equal(pool.select(dim, untouched), old.select(dim, untouched))
    ModelRunner.copy_blocks(runner, [])  # a batch without forks: nothing to do

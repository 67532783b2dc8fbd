"""The triton fused-MoE kernel against the torch path of SparseMoE (one product per expert over its
tokens), in the interpreter: pairs sorted by expert and padded to whole blocks, experts with no token,
an expert with more tokens than a block, routing weights renormalised or not, a shared expert; and
SparseMoE takes the kernel where ``kernels.triton_route`` offers it (a GPU tensor; here the lookup is opened)."""
import pytest
import torch

pytest.importorskip("triton")
pytestmark = pytest.mark.triton  # a triton form: make test-isa leaves these to the first pass

from actorserve.kernels import triton_route  # noqa: E402
from actorserve.kernels.moe import fused_moe_triton as fm  # noqa: E402
from actorserve.runtime.model.architectures.moe import FUSED_MOE_TRITON, SparseMoE  # noqa: E402


def test_pairs_are_sorted_by_expert_and_padded_to_blocks():
    experts = torch.tensor([[2, 0], [2, 3], [0, 2]])  # pairs 0..5: experts 2, 0, 2, 3, 0, 2
    ids, block_expert, used = fm.align_pairs(experts, num_experts=5, block_m=4)
    assert used.tolist() == [12]
    assert block_expert[:3].tolist() == [0, 2, 3]  # experts 1 and 4 have no block
    assert ids[:12].tolist() == [1, 4, 6, 6, 0, 2, 5, 6, 3, 6, 6, 6]  # 6: padding, past every pair
    # room for the most padding any routing of 6 pairs over 5 experts needs: blocks the kernel skips
    assert len(ids) == 24 and set(ids[12:].tolist()) == {6} and len(block_expert) == 6


def test_the_alignment_reads_no_value_on_the_host():
    """Every size follows from the shapes (what CUDA graph capture needs): it runs on the meta device,
    where any op whose output size depends on the values (bincount, repeat_interleave, int(...)) raises."""
    experts = torch.empty(7, 2, dtype=torch.int64, device="meta")
    ids, block_expert, used = fm.align_pairs(experts, num_experts=8, block_m=16)
    assert ids.shape == (16 * 9,) and block_expert.shape == (9,) and used.shape == (1,)  # (14 + 8 * 15) / 16


def _moe(seed, renormalize, shared, experts=6, top_k=2):
    torch.manual_seed(seed)
    moe = SparseMoE(32, 24, experts, top_k, renormalize, shared_inter=16 if shared else 0)
    for p in moe.parameters():
        torch.nn.init.normal_(p, 0.0, 0.2)
    return moe


@pytest.mark.parametrize("tokens", [1, 5, 40])
@pytest.mark.parametrize("renormalize, shared", [(True, False), (False, True)])
def test_the_kernel_equals_the_torch_path(device, tokens, renormalize, shared):
    moe = _moe(0, renormalize, shared).to(device)
    x = torch.randn(tokens, 32, generator=torch.Generator().manual_seed(1)).to(device)
    experts, weights = moe.route(x)
    got = fm.fused_moe(x, moe.experts_gate_up.view(6, 48, 32), moe.experts_down.view(6, 32, 24), experts, weights)
    ref = moe.forward(x) - (moe._add_shared(x, torch.zeros_like(x)) if shared else 0)
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-4)


def test_sparse_moe_takes_the_kernel_where_offered(monkeypatch, device):
    moe = _moe(2, True, True).to(device)
    x = torch.randn(9, 32, generator=torch.Generator().manual_seed(3)).to(device)
    plain = moe(x)
    calls = []

    def offer(t, module):
        calls.append(module)
        return fm if module == FUSED_MOE_TRITON else None
    monkeypatch.setattr(triton_route, "for_tensor", offer)
    torch.testing.assert_close(moe(x), plain, atol=1e-5, rtol=1e-4)
    assert calls and calls[0] == FUSED_MOE_TRITON

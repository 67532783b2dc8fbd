"""The GDN layers' triton kernels against the torch forms (and so against the token-by-token reference), in
the interpreter: the decode step, and the prefill over several sequences (fresh and continuing, cu_seqlens
as int32), with grouped value heads, head sizes that are not powers of two, only the given slots advanced;
and the GDN layer takes them where ``kernels.triton_route`` offers them."""
import pytest
import torch

pytest.importorskip("triton")
pytestmark = pytest.mark.triton  # a triton form: make test-isa leaves these to the first pass

from actorserve.kernels import triton_route  # noqa: E402
from actorserve.kernels.linear_attention import gated_delta as torch_step  # noqa: E402
from actorserve.kernels.linear_attention import gated_delta_triton as triton_step  # noqa: E402
from actorserve.runtime.model.architectures.linear_attention import GATED_DELTA_TRITON  # noqa: E402


def _inputs(b, hk, hv, dk, dv, seed):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(b, hk, dk, generator=g), torch.randn(b, hk, dk, generator=g),
            torch.randn(b, hv, dv, generator=g), -torch.rand(b, hv, generator=g), torch.rand(b, hv, generator=g))


@pytest.mark.parametrize("state_elements", [None, 160], ids=["whole-heads", "split-columns"])
def test_the_kernel_equals_the_torch_step(device, state_elements, monkeypatch):
    if state_elements is not None:  # a head's value columns over several programs, the last one partly
        monkeypatch.setattr(triton_step, "STATE_ELEMENTS", state_elements)
    hk, hv, dk, dv = 2, 6, 24, 12
    states = torch.randn(7, hv, dk, dv, generator=torch.Generator().manual_seed(0)) * 0.3
    slots = torch.tensor([5, 0, 3])
    expected_states = states.clone()
    for seed in range(3):  # three steps in a row: the state carries
        args = _inputs(3, hk, hv, dk, dv, seed)
        ref = torch_step.recurrent_step(*args, expected_states, slots)
        got_states = states.to(device)
        got = triton_step.recurrent_step(*(a.to(device) for a in args), got_states, slots.to(device))
        states = got_states.cpu()
        torch.testing.assert_close(got.cpu(), ref, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(states, expected_states, atol=1e-5, rtol=1e-4)
    untouched = [1, 2, 4, 6]
    assert torch.equal(states[untouched], expected_states[untouched])


@pytest.mark.parametrize("state_elements", [None, 160], ids=["whole-heads", "split-columns"])
def test_the_prefill_kernel_equals_the_chunked_form(device, state_elements, monkeypatch):
    if state_elements is not None:  # a head's value columns over several programs, the last one partly
        monkeypatch.setattr(triton_step, "STATE_ELEMENTS", state_elements)
    hk, hv, dk, dv = 2, 4, 20, 12
    lens = [5, 70, 1, 33]  # (a sequence longer than a chunk of the torch form)
    q, k, v, g, beta = _inputs(sum(lens), hk, hv, dk, dv, 4)
    cu = torch.tensor([0, 5, 75, 76, 109], dtype=torch.int32)
    slots, fresh = [3, 0, 5, 1], [True, False, False, True]
    states = torch.randn(6, hv, dk, dv, generator=torch.Generator().manual_seed(1)) * 0.3
    expected_states = states.clone()
    ref = torch_step.chunked_varlen(q, k, v, g, beta, cu, expected_states, slots, fresh)
    got_states = states.to(device)
    got = triton_step.recurrent_varlen(*(a.to(device) for a in (q, k, v, g, beta)), cu, got_states, slots, fresh)
    torch.testing.assert_close(got.cpu(), ref, atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(got_states.cpu(), expected_states, atol=2e-5, rtol=1e-4)
    assert torch.equal(got_states.cpu()[[2, 4]], states[[2, 4]])  # slots no sequence holds


def test_the_gdn_layer_takes_the_kernel_where_offered(monkeypatch, tmp_path, device):
    from actorserve.runtime.model.weights.hf_weights import read_config
    from actorserve.runtime.model.architectures.linear_attention import GatedDeltaNet, LinearLayerState, LinearStep
    from tests.conftest import save_tiny_model
    from tests.runtime.model.architectures.test_linear_attention import SHAPE

    cfg = read_config(str(save_tiny_model("qwen3_next", tmp_path / "m", **SHAPE)))
    layer = GatedDeltaNet(cfg)
    for p in layer.parameters():
        torch.nn.init.normal_(p, 0.0, 0.2)
    layer = layer.to(device)
    x = torch.randn(4, cfg.hidden_size, generator=torch.Generator().manual_seed(1)).to(device)
    step = LinearStep(2, torch.tensor([0, 2], device=device), torch.tensor([False, True], device=device),
                      [0, 1, 2], [3, 1], [True, False])  # two decodes, then a fresh and a continuing prefill
    outs, calls = [], []
    for offered in (False, True):
        def offer(t, module, offered=offered):
            calls.append(module)
            return triton_step if offered and module == GATED_DELTA_TRITON else None
        monkeypatch.setattr(triton_route, "for_tensor", offer)
        state = LinearLayerState.zeros(cfg, 4, torch.float32, torch.device(device))
        state.recurrent.normal_(0.0, 0.3, generator=torch.Generator(device=device).manual_seed(2))
        outs.append((layer(x, state, step), state.recurrent.clone()))
    torch.testing.assert_close(outs[1][0], outs[0][0], atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(outs[1][1], outs[0][1], atol=1e-5, rtol=1e-4)
    assert GATED_DELTA_TRITON in calls

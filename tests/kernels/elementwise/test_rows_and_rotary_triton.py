"""RMSNorm (with and without the residual add), SiLU-and-multiply and rotary + KV write against their
torch references, on small odd shapes (masked tails), in fp32 and bf16."""
import pytest
import torch

pytest.importorskip("triton")
pytestmark = pytest.mark.triton  # a triton form: make test-isa leaves these to the first pass

from actorserve.kernels.attention import write_kv_ref  # noqa: E402
from actorserve.kernels.elementwise import rms_norm_ref, rotary_ref, silu_mul_ref  # noqa: E402
from actorserve.kernels.elementwise import rotary_kv_triton as rotary_kv  # noqa: E402
from actorserve.kernels.elementwise import rows_triton as rows  # noqa: E402

TOL = {torch.float32: dict(atol=1e-5, rtol=1e-5), torch.bfloat16: dict(atol=2e-2, rtol=2e-2)}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rms_norm_and_the_residual_add(dtype, device):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(5, 72, generator=g).to(device, dtype)
    delta = torch.randn(5, 72, generator=g).to(device, dtype)
    w = (1 + 0.1 * torch.randn(72, generator=g)).to(device, dtype)
    torch.testing.assert_close(rows.rms_norm(x, w, 1e-6), rms_norm_ref(x, w, 1e-6), **TOL[dtype])
    summed, normed = rows.rms_norm(x, w, 1e-6, delta=delta)
    torch.testing.assert_close(summed, x + delta, **TOL[dtype])
    torch.testing.assert_close(normed, rms_norm_ref(x + delta, w, 1e-6), **TOL[dtype])
    assert not torch.equal(normed, rms_norm_ref(x, w, 1e-6))  # (the residual matters)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_silu_and_mul(dtype, device):
    x = torch.randn(3, 2, 2 * 1100, generator=torch.Generator().manual_seed(1)).to(device, dtype)
    out = rows.silu_mul(x)
    assert out.shape == (3, 2, 1100)
    torch.testing.assert_close(out, silu_mul_ref(x), **TOL[dtype])


def _table(positions, d):
    inv = 1.0 / (10000 ** (torch.arange(0, d, 2).float() / d))
    freqs = torch.cat([positions[:, None].float() * inv] * 2, dim=-1)
    sin = freqs.sin()
    return freqs.cos()[:, None, :], torch.cat([-sin[:, :d // 2], sin[:, d // 2:]], dim=-1)[:, None, :]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rotary_fused_with_the_kv_write(dtype, device):
    g = torch.Generator().manual_seed(2)
    t, h, kvh, d, blocks, bs = 7, 4, 2, 48, 6, 4
    qkv = torch.randn(t, (h + 2 * kvh) * d, generator=g).to(device, dtype)
    q, k, v = (x.view(t, -1, d) for x in qkv.split([h * d, kvh * d, kvh * d], dim=-1))  # strided views
    table = tuple(x.to(device, dtype) for x in _table(torch.tensor([0, 3, 9, 10, 11, 30, 31]), d))
    slots = torch.tensor([5, 0, 23, 6, 7, 12, 13], device=device)
    caches = [torch.zeros(kvh, blocks, bs, d, dtype=dtype, device=device) for _ in range(4)]
    q_rot, k_rot = rotary_kv.rotary_and_write_kv(q, k, v, table, caches[0], caches[1], slots)
    k_ref = rotary_ref(k, table)
    torch.testing.assert_close(q_rot, rotary_ref(q, table), **TOL[dtype])
    torch.testing.assert_close(k_rot, k_ref, **TOL[dtype])
    write_kv_ref(caches[2], caches[3], k_ref, v, slots)
    torch.testing.assert_close(caches[0], caches[2], **TOL[dtype])
    assert torch.equal(caches[1], caches[3])  # values are copied as they are
    # without a table: the write alone
    rotary_kv.rotary_and_write_kv(q, k, v, None, caches[0], caches[1], slots)
    write_kv_ref(caches[2], caches[3], k, v, slots)
    assert torch.equal(caches[0], caches[2]) and torch.equal(caches[1], caches[3])


def test_the_models_row_operations_take_the_triton_kernels_on_a_gpu(tiny_llama_dir, monkeypatch, device):
    """On a GPU the model's norms and activation go to these kernels (``kernels.elementwise``): here the
    route is opened for CPU tensors too, and a tiny Llama's logits match the torch path's."""
    from actorserve.kernels import elementwise
    from actorserve.runtime.transport.messages import ScheduledChunk, SchedulerOutput
    from actorserve.runtime.model.weights.loader import load_model
    from actorserve.runtime.model.execution.runner import ModelRunner

    model = load_model(str(tiny_llama_dir), "float32", skip_tokenizer=True, device=device).model
    step = SchedulerOutput(1, [], [ScheduledChunk("a", [5, 9, 2, 77, 31], 0, [1], True)], [])
    runner = ModelRunner(model, 4, 16, fast_decode=False, attention_backend="torch", device=device)
    monkeypatch.setattr(elementwise, "_on_triton", lambda x: None)
    expected = runner.forward(runner.prepare_inputs(step))
    calls = []

    class Counting:
        def __getattr__(self, name):
            calls.append(name)
            return getattr(rows, name)
    monkeypatch.setattr(elementwise, "_on_triton", lambda x: Counting())
    got = runner.forward(runner.prepare_inputs(step))
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)
    assert {"rms_norm", "silu_mul"} <= set(calls)

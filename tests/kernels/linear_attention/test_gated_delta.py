"""The gated delta rule and the causal convolution of the GDN layers: the chunked prefill form and the
batched decode step against the token-by-token reference (and against transformers' own torch functions),
states carried across calls, cu_seqlens normalised at the wrapper whatever it comes as; and why the gates
are fp32: with beta rounded to bf16 the recurrence drifts from an fp64 reference, with fp32 it does not."""
import pytest
import torch

from actorserve.kernels.linear_attention import causal_conv, gated_delta as gd

HK, HV, DK, DV = 2, 4, 16, 8


def _inputs(t, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    q, k = torch.randn(t, HK, DK, generator=g).to(dtype), torch.randn(t, HK, DK, generator=g).to(dtype)
    v = torch.randn(t, HV, DV, generator=g).to(dtype)
    decay = -torch.rand(t, HV, generator=g) * 0.6
    beta = torch.rand(t, HV, generator=g)
    return q, k, v, decay, beta


@pytest.mark.parametrize("t", [1, 17, 64, 150])
@pytest.mark.parametrize("with_state", [False, True])
def test_the_chunked_form_equals_the_recurrence(t, with_state):
    q, k, v, decay, beta = _inputs(t)
    s0 = torch.randn(HV, DK, DV, generator=torch.Generator().manual_seed(9)) * 0.2 if with_state else None
    ref, s_ref = gd.recurrent_ref(q, k, v, decay, beta, s0)
    out, s = gd.chunked(q, k, v, decay, beta, s0)
    torch.testing.assert_close(out, ref, atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(s, s_ref, atol=2e-5, rtol=1e-4)


def test_the_reference_agrees_with_transformers():
    from transformers.models.qwen3_next.modeling_qwen3_next import torch_recurrent_gated_delta_rule

    q, k, v, decay, beta = _inputs(40)
    s0 = torch.randn(HV, DK, DV, generator=torch.Generator().manual_seed(3)) * 0.2
    theirs, s_theirs = torch_recurrent_gated_delta_rule(q[None], k[None], v[None], decay[None], beta[None],
                                                        initial_state=s0[None], output_final_state=True,
                                                        use_qk_l2norm_in_kernel=True)
    ours, s = gd.recurrent_ref(q, k, v, decay, beta, s0)
    torch.testing.assert_close(ours, theirs[0], atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(s, s_theirs[0], atol=1e-6, rtol=1e-5)


def test_a_prefill_in_chunks_then_decode_steps_continue_the_sequence():
    """Two sequences in slots 4 and 1 of a state cache: a prefill split across two calls, then decode steps
    of both at once, equal the whole sequence through the reference; the other slots stay untouched."""
    q, k, v, decay, beta = _inputs(60, seed=1)
    q2, k2, v2, decay2, beta2 = _inputs(60, seed=2)
    states = torch.randn(6, HV, DK, DV)
    before = states.clone()
    split, prompt = 23, 50
    cat = lambda a, b, lo, hi: torch.cat([a[lo:hi], b[lo:hi]])  # noqa: E731
    for lo, hi, fresh in ((0, split, True), (split, prompt, False)):
        args = [cat(x, y, lo, hi) for x, y in ((q, q2), (k, k2), (v, v2), (decay, decay2), (beta, beta2))]
        gd.chunked_varlen(*args, torch.tensor([0, hi - lo, 2 * (hi - lo)], dtype=torch.int32), states, [4, 1],
                          [fresh, fresh])
    outs = []
    for t in range(prompt, 60):
        args = [torch.stack([x[t], y[t]]) for x, y in ((q, q2), (k, k2), (v, v2), (decay, decay2), (beta, beta2))]
        outs.append(gd.recurrent_step(*args, states, torch.tensor([4, 1])))
    ref1, s1 = gd.recurrent_ref(q, k, v, decay, beta)
    ref2, s2 = gd.recurrent_ref(q2, k2, v2, decay2, beta2)
    torch.testing.assert_close(torch.stack([o[0] for o in outs]), ref1[prompt:], atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(torch.stack([o[1] for o in outs]), ref2[prompt:], atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(states[4], s1, atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(states[1], s2, atol=2e-5, rtol=1e-4)
    for slot in (0, 2, 3, 5):
        assert torch.equal(states[slot], before[slot])


@pytest.mark.parametrize("cu", [[0, 3, 7], (0, 3, 7), torch.tensor([0, 3, 7]),
                                torch.tensor([0, 3, 7], dtype=torch.int32)], ids=["list", "tuple", "int64", "int32"])
def test_cu_seqlens_in_any_integer_form_means_the_same(cu):
    assert gd.normalise_cu_seqlens(cu, 7) == [0, 3, 7]


@pytest.mark.parametrize("cu", [[0, 3], [1, 3, 7], [0, 5, 3, 7], []])
def test_cu_seqlens_that_do_not_cover_the_tokens_are_refused(cu):
    with pytest.raises(ValueError, match="cu_seqlens"):
        gd.normalise_cu_seqlens(cu, 7)


def test_the_convolution_continues_across_chunks_and_decode_steps():
    g = torch.Generator().manual_seed(4)
    c, kernel, t = 12, 4, 30
    x, w = torch.randn(t, c, generator=g), torch.randn(c, kernel, generator=g)
    whole, _ = causal_conv.conv_ref(x, w)
    first, state = causal_conv.conv_ref(x[:11], w)
    second, state = causal_conv.conv_ref(x[11:25], w, state)
    states = torch.zeros(3, c, kernel - 1)
    states[2] = state
    steps = [causal_conv.conv_step(x[i:i + 1], w, states, torch.tensor([2]))[0] for i in range(25, t)]
    torch.testing.assert_close(torch.cat([first, second, torch.stack(steps)]), whole, atol=1e-6, rtol=1e-5)
    assert torch.equal(states[0], torch.zeros(c, kernel - 1))


def test_beta_in_bf16_drifts_where_fp32_does_not():
    """512 steps of one head from the same bf16 projections: with beta = sigmoid(b) taken in fp32 the outputs
    and the final state stay within 1e-5 of an fp64 recurrence; with beta rounded to bf16 (as the model's
    dtype would give it) every write is off, and the state and outputs leave the fp64 trajectory by a
    hundred times more, all along the sequence."""
    t = 512
    g = torch.Generator().manual_seed(5)
    q, k = torch.randn(t, 1, DK, generator=g), torch.randn(t, 1, DK, generator=g)
    v = torch.randn(t, 1, DV, generator=g)
    b = torch.randn(t, 1, generator=g).to(torch.bfloat16)  # the projection's output, in the model's dtype
    decay = torch.full((t, 1), -0.01)  # a long memory, where errors in the writes accumulate
    exact, s_exact = gd.recurrent_ref(q.double(), k.double(), v.double(), decay.double(), torch.sigmoid(b.double()))
    fp32, s32 = gd.recurrent_ref(q, k, v, decay, torch.sigmoid(b.float()))
    bf16, s16 = gd.recurrent_ref(q, k, v, decay, torch.sigmoid(b).float())  # sigmoid in bf16, then widened
    err32 = (fp32.double() - exact).abs().amax(dim=(1, 2))
    err16 = (bf16.double() - exact).abs().amax(dim=(1, 2))
    assert err32.max() < 1e-5 and (s32.double() - s_exact).abs().max() < 1e-5
    assert err16[-64:].mean() > 100 * err32[-64:].mean()
    assert (s16.double() - s_exact).abs().max() > 100 * (s32.double() - s_exact).abs().max()

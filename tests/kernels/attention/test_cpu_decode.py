"""The C paged decode kernel on its own, in bf16 and fp32: long sequences spread over shuffled blocks,
several query-head group sizes and head dims, against fp64 attention of each sequence."""
import random

import pytest
import torch

from actorserve.kernels.attention import cpu_decode

pytestmark = pytest.mark.skipif(not cpu_decode.available(),
                                reason="needs a CPU with AVX2 and a C compiler")


def make_case(lens, kvh, g, d, bs, seed=0, dtype=torch.bfloat16):
    rng = random.Random(seed)
    torch.manual_seed(seed)
    nb = sum(-(-n // bs) for n in lens) + 3
    free = list(range(nb))
    rng.shuffle(free)
    k_cache = torch.randn(kvh, nb, bs, d).to(dtype)  # unused slots hold noise, not zeros
    v_cache = torch.randn(kvh, nb, bs, d).to(dtype)
    width = max(-(-n // bs) for n in lens) + 1
    tables = torch.full((len(lens), width), 10**6, dtype=torch.int64)  # padding past a table's end is never read
    for b, n in enumerate(lens):
        tables[b, :-(-n // bs)] = torch.tensor([free.pop() for _ in range(-(-n // bs))])
    q = torch.randn(len(lens), kvh * g, d).to(dtype)
    return q, k_cache, v_cache, tables, torch.tensor(lens, dtype=torch.int64)


def dense_ref(q, k_cache, v_cache, tables, lens, scale):
    kvh, _, bs, d = k_cache.shape
    g = q.shape[1] // kvh
    out = []
    for b, n in enumerate(lens.tolist()):
        blocks = tables[b, :-(-n // bs)]
        k = k_cache[:, blocks].reshape(kvh, -1, d)[:, :n].double()  # [KVH, n, D]
        v = v_cache[:, blocks].reshape(kvh, -1, d)[:, :n].double()
        qb = q[b].double().view(kvh, g, d)
        p = (qb @ k.transpose(1, 2) * scale).softmax(-1)
        out.append((p @ v).reshape(kvh * g, d))
    return torch.stack(out)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("kvh,g,d,bs", [(3, 3, 64, 16), (1, 8, 128, 16), (2, 1, 32, 4), (2, 16, 256, 32)])
def test_matches_fp64_attention(kvh, g, d, bs, dtype):
    if not cpu_decode.available(dtype):
        pytest.skip(f"no {dtype} build here")
    lens = [1, 2, 15, 16, 17, 33, 300, 129]
    q, k_cache, v_cache, tables, seq_lens = make_case(lens, kvh, g, d, bs, dtype=dtype)
    scale = d ** -0.5
    out = cpu_decode.paged_decode(q, k_cache, v_cache, tables, seq_lens, scale)
    want = dense_ref(q, k_cache, v_cache, tables, seq_lens, scale)
    assert out.dtype == dtype and out.shape == q.shape
    if dtype == torch.bfloat16:
        # fp32 scores and accumulation: the only sizeable error is the final rounding to bf16 (2^-8 relative)
        torch.testing.assert_close(out.double(), want, atol=1e-2, rtol=8e-3)
    else:  # fp32 all through: the order of the sums and exp's last bit
        torch.testing.assert_close(out.double(), want, atol=2e-6, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("threads", [2, 3, 4])
def test_few_long_sequences_split_their_keys_among_the_threads(dtype, threads):
    """Fewer (sequence, KV head) items than twice the threads: each item's keys are cut into parts, one per
    unit of work, and the parts' softmaxes merged; the same attention as in one piece (here against fp64,
    and under a sliding window and a softcap against the one-thread answer, which takes no parts). The
    second sequence is too short to fill every part."""
    if not cpu_decode.available(dtype):
        pytest.skip(f"no {dtype} build here")
    q, k_cache, v_cache, tables, seq_lens = make_case([700, 40], 1, 3, 64, 16, dtype=dtype)
    scale = 0.125
    saved = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        whole = [cpu_decode.paged_decode(q, k_cache, v_cache, tables, seq_lens, scale, window=w, softcap=c)
                 for w, c in ((0, 0.0), (300, 0.0), (0, 5.0))]
        torch.set_num_threads(threads)
        split = [cpu_decode.paged_decode(q, k_cache, v_cache, tables, seq_lens, scale, window=w, softcap=c)
                 for w, c in ((0, 0.0), (300, 0.0), (0, 5.0))]
    finally:
        torch.set_num_threads(saved)
    want = dense_ref(q, k_cache, v_cache, tables, seq_lens, scale)
    tol = dict(atol=1e-2, rtol=8e-3) if dtype == torch.bfloat16 else dict(atol=2e-6, rtol=1e-5)
    torch.testing.assert_close(split[0].double(), want, **tol)
    for a, b in zip(whole, split):
        torch.testing.assert_close(b.double(), a.double(), **tol)


def test_strided_query_rows_are_read_in_place():
    """q as the q columns of a fused q|k output (rows strided, heads contiguous) gives the contiguous answer."""
    q, k_cache, v_cache, tables, seq_lens = make_case([5, 70, 33], 3, 3, 64, 16)
    wide = torch.randn(q.shape[0], q.shape[1] + 3, q.shape[2]).to(torch.bfloat16)
    wide[:, :q.shape[1]] = q
    strided = wide[:, :q.shape[1]]
    assert not strided.is_contiguous()
    out = cpu_decode.paged_decode(strided, k_cache, v_cache, tables, seq_lens, 0.125)
    assert torch.equal(out, cpu_decode.paged_decode(q, k_cache, v_cache, tables, seq_lens, 0.125))


def test_peaked_scores_stay_finite_and_pick_their_key():
    """Large logits (a query aligned with one key) must not overflow the exponent."""
    q, k_cache, v_cache, tables, seq_lens = make_case([40], 1, 2, 64, 16)
    pos = 37
    blk, off = tables[0, pos // 16], pos % 16
    q[0, 0] = (k_cache[0, blk, off].float() * 50).to(torch.bfloat16)
    out = cpu_decode.paged_decode(q, k_cache, v_cache, tables, seq_lens, 1.0)
    assert torch.isfinite(out.float()).all()
    torch.testing.assert_close(out[0, 0].float(), v_cache[0, blk, off].float(), atol=1e-2, rtol=1e-2)


def test_rejects_what_it_cannot_read():
    q, k_cache, v_cache, tables, seq_lens = make_case([20, 5], 2, 2, 64, 16)
    with pytest.raises(ValueError, match="longer than its block table"):
        cpu_decode.paged_decode(q, k_cache, v_cache, tables[:, :1], seq_lens, 1.0)
    with pytest.raises(ValueError, match="int64"):
        cpu_decode.paged_decode(q, k_cache, v_cache, tables.int(), seq_lens, 1.0)


def test_supports_is_the_shape_gate():
    assert cpu_decode.supports(torch.bfloat16, 9, 3, 64)
    assert cpu_decode.supports(torch.float32, 9, 3, 64) == cpu_decode.available(torch.float32)
    assert not cpu_decode.supports(torch.float16, 9, 3, 64)  # no build for it
    assert not cpu_decode.supports(torch.bfloat16, 9, 3, 48)  # D % 32
    assert not cpu_decode.supports(torch.bfloat16, 34, 2, 64)  # 17 query heads per KV head


def test_write_kv_stores_strided_rows_at_their_slots():
    from actorserve.kernels.attention.torch_ref import write_kv_ref

    kvh, nb, bs, d, t = 3, 10, 16, 64, 7
    qkv = torch.randn(t, 15 * d).bfloat16()  # k and v as the backend gets them: columns of a fused output
    k, v = qkv[:, 9 * d:12 * d].view(t, kvh, d), qkv[:, 12 * d:].view(t, kvh, d)
    slots = torch.randperm(nb * bs)[:t]
    ours = [torch.zeros(kvh, nb, bs, d).bfloat16() for _ in range(2)]
    ref = [c.clone() for c in ours]
    cpu_decode.write_kv(*ours, k, v, slots)
    write_kv_ref(*ref, k, v, slots)
    assert torch.equal(ours[0], ref[0]) and torch.equal(ours[1], ref[1])
    before = [c.clone() for c in ours]
    with pytest.raises(IndexError, match="outside the KV cache"):
        cpu_decode.write_kv(*ours, k, v, torch.cat([slots[:-1], torch.tensor([nb * bs])]))
    assert torch.equal(ours[0], before[0]) and torch.equal(ours[1], before[1])  # nothing half-written


def test_fp32_writes_and_reads_its_own_cache():
    """write_kv and paged_decode of the fp32 build: the rows land at their slots, and a query reads them."""
    if not cpu_decode.available(torch.float32):
        pytest.skip("no fp32 build here")
    from actorserve.kernels.attention.torch_ref import write_kv_ref

    kvh, nb, bs, d, t = 2, 6, 16, 64, 5
    qkv = torch.randn(t, 8 * d)
    k, v = qkv[:, 4 * d:6 * d].view(t, kvh, d), qkv[:, 6 * d:].view(t, kvh, d)
    slots = torch.tensor([3, 17, 40, 41, 90])
    caches = [torch.zeros(kvh, nb, bs, d) for _ in range(4)]
    cpu_decode.write_kv(caches[0], caches[1], k, v, slots)
    write_kv_ref(caches[2], caches[3], k, v, slots)
    assert torch.equal(caches[0], caches[2]) and torch.equal(caches[1], caches[3])


FP32_OVER_BF16 = pytest.mark.skipif(not cpu_decode.available(torch.float32, torch.bfloat16),
                                    reason="no build of fp32 queries over a bf16 cache here")


@FP32_OVER_BF16
@pytest.mark.parametrize("kvh,g,d,bs", [(3, 3, 64, 16), (1, 8, 128, 16), (2, 1, 32, 4)])
def test_fp32_queries_over_a_bf16_cache(kvh, g, d, bs):
    """--kv-cache-dtype bfloat16 under an fp32 model: the cache's bf16 keys and values widened exactly, the
    rest fp32, so the answer is fp32 attention over the cache's values (not over q rounded to bf16)."""
    lens = [1, 15, 16, 17, 300, 129]
    q, k_cache, v_cache, tables, seq_lens = make_case(lens, kvh, g, d, bs, dtype=torch.bfloat16)
    q = torch.randn(q.shape)  # fp32, with bits below bf16's
    scale = d ** -0.5
    out = cpu_decode.paged_decode(q, k_cache, v_cache, tables, seq_lens, scale)
    assert out.dtype == torch.float32 and out.shape == q.shape
    torch.testing.assert_close(out.double(), dense_ref(q, k_cache, v_cache, tables, seq_lens, scale),
                               atol=2e-6, rtol=1e-5)


@FP32_OVER_BF16
def test_fp32_rows_written_to_a_bf16_cache_round_as_torch(monkeypatch):
    """write_kv of fp32 rows into a bf16 cache holds torch's .to(torch.bfloat16) of them, ties, NaN and
    infinities included; the C call is taken (not the torch reference)."""
    from actorserve.kernels.attention.torch_ref import write_kv_ref

    kvh, nb, bs, d, t = 3, 6, 16, 64, 7
    qkv = torch.randn(t, 15 * d)
    qkv[0, 9 * d:9 * d + 4] = torch.tensor([float("nan"), float("inf"), -float("inf"), 1.0 + 2 ** -8])  # a tie
    qkv[1, 12 * d] = 3.0 * 2 ** -8 + 1.0  # the other tie: rounds up to even
    k, v = qkv[:, 9 * d:12 * d].view(t, kvh, d), qkv[:, 12 * d:].view(t, kvh, d)
    slots = torch.randperm(nb * bs)[:t]
    ours = [torch.zeros(kvh, nb, bs, d, dtype=torch.bfloat16) for _ in range(2)]
    ref = [c.clone() for c in ours]
    with monkeypatch.context() as m:
        m.setattr(cpu_decode, "write_kv_ref", lambda *a: pytest.fail("the torch reference wrote the rows"))
        cpu_decode.write_kv(*ours, k, v, slots)
    write_kv_ref(*ref, k, v, slots)
    for a, b in zip(ours, ref):  # (a NaN's bits are torch's business: its vector and scalar paths differ)
        assert torch.equal(a.isnan(), b.isnan()) and a.isnan().sum() == (a is ours[0])
        zero = torch.zeros((), dtype=torch.bfloat16)
        assert torch.equal(a.where(~a.isnan(), zero).view(torch.int16), b.where(~b.isnan(), zero).view(torch.int16))


def test_a_cache_of_another_dtype_is_refused():
    q, k_cache, v_cache, tables, seq_lens = make_case([20, 5], 2, 2, 64, 16)
    with pytest.raises(ValueError, match="no kernel"):  # bf16 queries over an fp32 cache: no build
        cpu_decode.paged_decode(q, k_cache.float(), v_cache.float(), tables, seq_lens, 1.0)
    with pytest.raises(ValueError, match="no kernel"):  # K and V of different dtypes
        cpu_decode.paged_decode(q.float(), k_cache, v_cache.float(), tables, seq_lens, 1.0)
    assert not cpu_decode.supports(torch.bfloat16, 9, 3, 64, kv_dtype=torch.float32)
    assert cpu_decode.supports(torch.float32, 9, 3, 64, kv_dtype=torch.bfloat16) == cpu_decode.available(
        torch.float32, torch.bfloat16)

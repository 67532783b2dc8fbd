"""The paged backends (torch, and torch with the C decode kernel) against plain dense causal attention of
each sequence on its own."""
import random

import pytest
import torch

from actorserve.kernels.attention import AttentionMetadata, SequenceGroup, TorchRefBackend, cpu_decode

KVH, H, D, BS, NB = 2, 6, 64, 4, 64
BACKENDS = {"torch": TorchRefBackend, "cpu_decode": cpu_decode.CpuDecodeBackend}


def dense(q, k, v, context: int, scale: float):
    """q [n, H, D] at positions context.., k/v [context + n, KVH, D]."""
    g = H // KVH
    k, v = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q.double(), k.double()) * scale
    q_pos = torch.arange(context, context + q.shape[0])[:, None]
    scores = scores.masked_fill(torch.arange(k.shape[0])[None, :] > q_pos, float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), v.double())


def group(seqs, token_start, tables):
    q_lens = [n for _, n in seqs]
    seq_lens = [c + n for c, n in seqs]
    width = max(len(t) for t in tables)
    starts = [0]
    for n in q_lens:
        starts.append(starts[-1] + n)
    return SequenceGroup(
        token_start=token_start, token_end=token_start + starts[-1],
        block_tables=torch.tensor([t + [0] * (width - len(t)) for t in tables]),
        seq_lens=torch.tensor(seq_lens), query_start_loc=torch.tensor(starts),
        max_query_len=max(q_lens), max_seq_len=max(seq_lens),
        query_lens=tuple(q_lens), context_lens=tuple(c for c, _ in seqs))


@pytest.mark.parametrize("backend_name", list(BACKENDS))
# (the model's dtype, the cache's): fp32 over bf16 is --kv-cache-dtype bfloat16
@pytest.mark.parametrize("dtype,kv_dtype", [(torch.float32, torch.float32), (torch.bfloat16, torch.bfloat16),
                                            (torch.float32, torch.bfloat16)])
@pytest.mark.parametrize("decodes,prefills", [
    ([(5, 1), (0, 1), (17, 1)], []),              # decodes only, one with nothing cached before it
    ([], [(0, 7), (0, 3)]),                       # fresh prompts
    ([], [(6, 5), (0, 4), (13, 1)]),              # chunks continuing a cached prefix, mixed lengths
    ([(9, 1), (30, 1)], [(3, 6), (0, 2)]),        # decodes and prefills in one step
])
def test_paged_matches_dense(decodes, prefills, dtype, kv_dtype, backend_name):
    if backend_name == "cpu_decode" and not cpu_decode.supports(dtype, H, KVH, D, kv_dtype=kv_dtype):
        pytest.skip("no build of the C decode kernel for these dtypes here")
    rng = random.Random(0)
    torch.manual_seed(0)
    backend = BACKENDS[backend_name](KVH, NB, BS)
    k_cache = torch.zeros(backend.kv_cache_shape(NB, BS, KVH, D), dtype=kv_dtype)
    v_cache = torch.zeros_like(k_cache)
    free = list(range(NB))
    rng.shuffle(free)
    seqs = decodes + prefills
    tables, history, slots, new = [], [], [], []
    for context, n in seqs:
        table = [free.pop() for _ in range(-(-(context + n) // BS))]
        tables.append(table)
        # (values the cache holds exactly: the dense answer is then the one over the cache's values)
        k_all = torch.randn(context + n, KVH, D).to(kv_dtype).to(dtype)
        v_all = torch.randn(context + n, KVH, D).to(kv_dtype).to(dtype)
        history.append((k_all, v_all))
        # the context was written by earlier steps
        ctx_slots = torch.tensor([table[p // BS] * BS + p % BS for p in range(context)], dtype=torch.long)
        if context:
            k_cache.view(KVH, -1, D).index_copy_(1, ctx_slots, k_all[:context].transpose(0, 1).to(kv_dtype))
            v_cache.view(KVH, -1, D).index_copy_(1, ctx_slots, v_all[:context].transpose(0, 1).to(kv_dtype))
        slots += [table[p // BS] * BS + p % BS for p in range(context, context + n)]
        new.append((k_all[context:], v_all[context:]))
    q = torch.randn(sum(n for _, n in seqs), H, D).to(dtype)
    k = torch.cat([a for a, _ in new])
    v = torch.cat([b for _, b in new])
    meta = AttentionMetadata(
        slot_mapping=torch.tensor(slots, dtype=torch.long),
        decode=group(decodes, 0, tables[:len(decodes)]) if decodes else None,
        prefill=group(prefills, len(decodes), tables[len(decodes):]) if prefills else None)
    scale = D ** -0.5
    out = backend.forward(q, k, v, k_cache, v_cache, backend.prepare(meta), scale)
    assert out.shape == q.shape and out.dtype == dtype
    tol = 1e-5 if dtype == torch.float32 else 3e-2
    start = 0
    for (context, n), (k_all, v_all) in zip(seqs, history):
        want = dense(q[start:start + n], k_all, v_all, context, scale)
        torch.testing.assert_close(out[start:start + n].double(), want, atol=tol, rtol=tol)
        start += n
    # the new K/V landed in their slots
    flat = k_cache.view(KVH, -1, D)[:, torch.tensor(slots)].transpose(0, 1)
    torch.testing.assert_close(flat.to(dtype), k, atol=0, rtol=0)

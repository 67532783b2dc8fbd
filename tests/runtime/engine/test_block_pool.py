"""Block pool and KV cache manager: reference counts, prefix hits, LRU eviction of free cached blocks."""
import pytest

from actorserve.runtime.engine.block_pool import BlockPool
from actorserve.runtime.engine.kv_cache_manager import KVCacheManager
from actorserve.runtime.engine.request import Request
from actorserve.runtime.engine.sampling_params import SamplingParams


def _req(rid, tokens):
    return Request(rid, list(tokens), SamplingParams(), 0, 10_000)


def test_allocate_free_and_double_free():
    pool = BlockPool(4)
    blocks = pool.allocate(3)
    assert pool.num_free_blocks == 1
    with pytest.raises(RuntimeError):
        pool.allocate(2)
    pool.free(blocks)
    assert pool.num_free_blocks == 4
    with pytest.raises(RuntimeError, match="twice"):
        pool.free(blocks[:1])


def test_prefix_hit_shares_blocks_and_keeps_one_token_to_compute():
    kv = KVCacheManager(num_blocks=8, block_size=4)
    a = _req("a", range(12))
    assert kv.allocate(a, 12)
    a.num_computed_tokens = 12
    kv.publish_full_blocks(a)
    b = _req("b", range(12))
    hit = kv.find_cached_prefix(b)
    assert len(hit) == 2  # the last block is recomputed so the final token yields logits
    assert kv.allocate(b, 4, hit)
    assert kv.block_ids("b")[:2] == kv.block_ids("a")[:2]
    assert kv.block_ids("b")[2] != kv.block_ids("a")[2]
    kv.free(a)
    kv.free(b)
    assert kv.pool.num_free_blocks == 8


def test_free_cached_blocks_are_revived_then_evicted_lru():
    kv = KVCacheManager(num_blocks=4, block_size=2)
    a = _req("a", [1, 2, 3, 4, 5])
    assert kv.allocate(a, 5)
    a.num_computed_tokens = 5
    kv.publish_full_blocks(a)
    kv.free(a)
    assert kv.pool.num_free_blocks == 4
    again = _req("a2", [1, 2, 3, 4, 9])
    assert len(kv.find_cached_prefix(again)) == 2
    other = _req("c", [7] * 8)
    assert kv.allocate(other, 8)  # takes every block, evicting the cached ones
    assert kv.find_cached_prefix(again) == []


def test_token_slice_spans_prompt_and_output():
    r = _req("s", [1, 2, 3])
    r.output_token_ids = [4, 5]
    for start in range(6):
        for end in range(start, 6):
            assert r.token_slice(start, end) == [1, 2, 3, 4, 5][start:end]

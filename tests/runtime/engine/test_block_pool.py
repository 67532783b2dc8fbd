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


def _compute(kv, req, n):
    """n more of the request's tokens computed, as a step does: room for them, then their blocks published."""
    assert kv.allocate(req, n)
    req.num_computed_tokens += n
    kv.publish_full_blocks(req)


@pytest.mark.parametrize("caching", [True, False])
def test_a_sliding_window_gives_back_the_blocks_it_has_left(caching):
    """Window 6, blocks of 4: once the next token's window starts past a block, the block goes back to the
    pool and the null block takes its place in the table; the tokens that still need it keep it."""
    kv = KVCacheManager(num_blocks=10, block_size=4, enable_caching=caching, sliding_window=6)
    null = kv.null_block.block_id
    assert kv.pool.num_free_blocks == 9  # the null block is never handed out
    a = _req("a", range(9))
    _compute(kv, a, 9)  # the next token (position 9) sees 4 .. 9: block 0 (0 .. 3) is out
    assert kv.block_ids("a")[0] == null and null not in kv.block_ids("a")[1:]
    assert kv.pool.num_free_blocks == 9 - 3 + 1
    a.output_token_ids += [1, 2, 3]
    _compute(kv, a, 3)  # next is 12, which sees 7 ..: block 1 (4 .. 7) is needed still
    assert kv.block_ids("a")[:2] == [null, kv.block_ids("a")[1]] and kv.block_ids("a")[1] != null
    a.output_token_ids += [4]
    _compute(kv, a, 1)  # next is 13, which sees 8 ..: block 1 goes too
    assert kv.block_ids("a")[:2] == [null, null]
    assert kv.pool.num_free_blocks == 9 - 4 + 2
    kv.free(a)
    assert kv.pool.num_free_blocks == 9  # everything but the null block, each block freed once


def test_a_sliding_window_block_given_back_stays_cached_for_an_equal_prompt():
    kv = KVCacheManager(num_blocks=10, block_size=4, sliding_window=4)
    a = _req("a", range(13))
    _compute(kv, a, 13)
    dropped = kv.pool.blocks[[b for b in range(10) if b != kv.null_block.block_id][0]]
    assert kv.block_ids("a")[:2] == [kv.null_block.block_id] * 2
    b = _req("b", range(13))
    cached = kv.find_cached_prefix(b)  # the whole prompt's full blocks, the given-back ones revived
    assert len(cached) == 3 and dropped in cached
    assert kv.allocate(b, 1, cached)
    kv.free(a)
    kv.free(b)
    assert kv.pool.num_free_blocks == 9


def test_without_a_window_nothing_is_given_back():
    kv = KVCacheManager(num_blocks=10, block_size=4)
    a = _req("a", range(30))
    _compute(kv, a, 30)
    assert kv.null_block is None and kv.pool.num_free_blocks == 10 - 8


def test_a_fork_shares_the_parent_s_full_blocks_and_copies_its_partial_one():
    kv = KVCacheManager(num_blocks=8, block_size=4)
    parent = _req("p", range(10))
    _compute(kv, parent, 10)
    ids = kv.block_ids("p")
    table = kv.detach(parent)  # the parent leaves; its blocks stay, held for the children
    assert kv.block_ids("p") == [] and kv.pool.num_free_blocks == 5
    children = [_req(f"c{k}", list(range(10)) + [100 + k]) for k in range(2)]
    copies = [kv.fork(child, table, 10) for child in children]
    for child, copy in zip(children, copies):
        own = kv.block_ids(child.request_id)
        assert own[:2] == ids[:2] and own[2] not in ids  # full blocks shared, the third copied
        assert copy == [(ids[2], own[2])] and child.num_computed_tokens == 10
    kv.release(table)
    assert kv.pool.num_free_blocks == 4  # two shared full blocks and the two copies are the children's
    assert all(kv.allocate(child, 1) for child in children)  # the new token fits the copied block
    for child in children:
        kv.free(child)
    assert kv.pool.num_free_blocks == 8


def test_a_fork_at_a_block_boundary_copies_nothing_and_one_without_a_free_block_fails():
    kv = KVCacheManager(num_blocks=3, block_size=4)
    parent = _req("p", range(8))
    _compute(kv, parent, 8)
    table = kv.detach(parent)
    child = _req("a", list(range(8)) + [1])
    assert kv.fork(child, table, 8) == []  # the new token starts a block
    kv.release(table)
    kv.free(child)
    parent = _req("q", range(9))
    _compute(kv, parent, 9)
    table = kv.detach(parent)
    assert kv.pool.num_free_blocks == 0
    assert kv.fork(_req("b", list(range(9)) + [1]), table, 9) is None  # no block for the copy
    kv.release(table)

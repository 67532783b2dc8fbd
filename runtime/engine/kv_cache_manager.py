"""Per-request block tables over the block pool, with prefix-cache lookup on admission.

The scheduler asks for room for N more tokens of a request; this module finds cached prefix blocks first,
allocates the rest, and publishes blocks to the cache as they fill.

Where every layer of the model slides over a window, a block whose tokens have all fallen out of the
window of every token still to come is read by no one again: it goes back to the pool (cached, where
prefix caching is on, so an equal prompt may still revive it), and its place in the table takes the null
block, which is never handed out or written. The attention kernels start each row at its window's first
block, so they never read it.

A hybrid model's linear-attention layers keep a recurrent state per request instead of keys: each request
holds one state slot from admission until it ends or is preempted, taken and given back with its blocks.
"""
from __future__ import annotations

from typing import Optional

from actorserve.runtime.engine.block_pool import Block, BlockPool, hash_block
from actorserve.runtime.engine.request import Request


class KVCacheManager:
    def __init__(self, num_blocks: int, block_size: int, enable_caching: bool = True,
                 sliding_window: Optional[int] = None, num_state_slots: int = 0) -> None:
        self.block_size = block_size
        self.pool = BlockPool(num_blocks, enable_caching)
        self._tables: dict[str, list[Block]] = {}
        self._hashes: dict[str, list[int]] = {}  # chained hashes of the request's full blocks so far
        self._num_published: dict[str, int] = {}
        self.sliding_window = sliding_window
        self.null_block: Optional[Block] = None
        self._num_dropped: dict[str, int] = {}  # leading blocks of each table given back, out of the window
        self.num_state_slots = num_state_slots
        self._free_slots = list(range(num_state_slots - 1, -1, -1))  # popped from the end: slot 0 first
        self._slots: dict[str, int] = {}
        if sliding_window is not None:
            if sliding_window < 1:
                raise ValueError(f"sliding_window must be >= 1, got {sliding_window}")
            self.null_block = self.pool.allocate(1)[0]  # held for good: the pool never hands it out

    def block_ids(self, request_id: str) -> list[int]:
        return [b.block_id for b in self._tables.get(request_id, ())]

    def state_slot(self, request_id: str) -> int:
        """The request's recurrent-state slot (-1 where the model keeps no states)."""
        return self._slots.get(request_id, -1)

    def _block_hashes(self, request: Request) -> list[int]:
        hashes = self._hashes.setdefault(request.request_id, [])
        bs = self.block_size
        while (len(hashes) + 1) * bs <= request.num_tokens:
            i = len(hashes)
            hashes.append(hash_block(hashes[-1] if hashes else None, request.token_slice(i * bs, (i + 1) * bs)))
        return hashes

    def find_cached_prefix(self, request: Request) -> list[Block]:
        """Cached full blocks of the request's tokens; at least one token is always left to compute."""
        hashes = self._block_hashes(request)
        max_blocks = (request.num_tokens - 1) // self.block_size
        return self.pool.lookup(hashes[:max_blocks])

    def allocate(self, request: Request, num_new_tokens: int, cached: Optional[list[Block]] = None) -> bool:
        """Make room for num_new_tokens beyond what is computed (and cached); False if the pool is short."""
        table = self._tables.get(request.request_id, [])
        cached = cached or []
        total = request.num_computed_tokens + len(cached) * self.block_size + num_new_tokens
        needed = -(-total // self.block_size) - len(table) - len(cached)
        # Reviving a cached block that nobody holds takes it out of the free queue too.
        revived = sum(1 for b in cached if b.ref_cnt == 0)
        if needed + revived > self.pool.num_free_blocks:
            return False
        if self.num_state_slots and request.request_id not in self._slots:
            if not self._free_slots:
                return False
            self._slots[request.request_id] = self._free_slots.pop()
        self.pool.touch(cached)
        table = table + cached + self.pool.allocate(max(needed, 0))
        self._tables[request.request_id] = table
        return True

    def publish_full_blocks(self, request: Request) -> None:
        """Cache the blocks whose tokens are now all computed."""
        table = self._tables.get(request.request_id)
        if not table:
            return
        hashes = self._block_hashes(request)
        full = min(request.num_computed_tokens // self.block_size, len(hashes), len(table))
        start = self._num_published.get(request.request_id, 0)
        for i in range(start, full):
            self.pool.cache(table[i], hashes[i])
        self._num_published[request.request_id] = max(start, full)
        if self.sliding_window is not None:
            self._drop_out_of_window(request, table, full)

    def _drop_out_of_window(self, request: Request, table: list[Block], published: int) -> None:
        """Give back the leading blocks no later token's window reaches: the next token, at position
        num_computed_tokens, sees keys from num_computed_tokens - window + 1 on. Only published (or, with
        caching off, full and computed) blocks go."""
        first_seen = request.num_computed_tokens - self.sliding_window + 1
        end = min(max(first_seen, 0) // self.block_size, published, len(table))
        start = self._num_dropped.get(request.request_id, 0)
        if end <= start:
            return
        self.pool.free(table[start:end])
        table[start:end] = [self.null_block] * (end - start)
        self._num_dropped[request.request_id] = end

    def trim(self, request: Request, num_tokens: int) -> None:
        """Give back the blocks past the first ``num_tokens`` tokens (rejected draft tokens' slots); none of
        them is published, since only computed tokens' full blocks are."""
        table = self._tables.get(request.request_id)
        keep = -(-num_tokens // self.block_size)
        if table is not None and len(table) > keep:
            self.pool.free(table[keep:])
            del table[keep:]

    def detach(self, request: Request) -> list[Block]:
        """The request's table, handed to the caller with its references (``fork`` then ``release``), as the
        request leaves: its blocks stay as they are while the caller holds them."""
        table = self._tables.pop(request.request_id, [])
        self.free(request)
        return table

    def fork(self, child: Request, parent: list[Block], computed: int) -> Optional[list[tuple[int, int]]]:
        """Give ``child`` the first ``computed`` tokens of a detached ``parent`` table, copy-on-write: the full
        blocks shared, the last, partly filled one copied into a block of the child's own. Returns the
        (source, destination) copies for the worker to make, or None when no block is free for the copy.
        Only where no window slides (a table with dropped blocks is not shared)."""
        full, partial = divmod(computed, self.block_size)
        if partial and self.pool.num_free_blocks < 1:
            return None
        shared = parent[:full]
        self.pool.touch(shared)
        copies = []
        table = list(shared)
        if partial:
            own = self.pool.allocate(1)[0]
            copies.append((parent[full].block_id, own.block_id))
            table.append(own)
        self._tables[child.request_id] = table
        self._num_published[child.request_id] = full
        child.num_computed_tokens = computed
        return copies

    def release(self, table: list[Block]) -> None:
        """Drop the references of a table ``detach`` handed out."""
        self.pool.free(table)

    def free(self, request: Request) -> None:
        table = self._tables.pop(request.request_id, [])
        self.pool.free(table[self._num_dropped.pop(request.request_id, 0):])
        self._hashes.pop(request.request_id, None)
        self._num_published.pop(request.request_id, None)
        slot = self._slots.pop(request.request_id, None)
        if slot is not None:
            self._free_slots.append(slot)

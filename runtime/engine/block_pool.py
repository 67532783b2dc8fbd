"""The paged KV block pool with prefix caching.

A block holds ``block_size`` tokens' K/V in every layer. Full blocks are named by a chained hash of
(parent hash, their token ids), so equal prefixes map to the same blocks. Blocks are reference counted;
a block nobody references stays cached and sits in an LRU free queue, and is evicted only when a new block
is needed. Pure bookkeeping: the tensors live in the worker.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Optional, Sequence


def hash_block(parent: Optional[int], token_ids: Sequence[int]) -> int:
    return hash((parent, tuple(token_ids)))


class Block:
    __slots__ = ("block_id", "ref_cnt", "block_hash")

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.ref_cnt = 0
        self.block_hash: Optional[int] = None


class BlockPool:
    def __init__(self, num_blocks: int, enable_caching: bool = True) -> None:
        if num_blocks < 1:
            raise ValueError(f"the KV cache needs at least one block, got {num_blocks}")
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self.blocks = [Block(i) for i in range(num_blocks)]
        # Free blocks, least recently freed first; cached ones among them can still be revived.
        self._free: OrderedDict[int, Block] = OrderedDict((b.block_id, b) for b in self.blocks)
        self._cached: dict[int, Block] = {}
        self.hits = 0  # prefix-cache hits counted in tokens
        self.queries = 0  # prompt tokens looked up

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def usage(self) -> float:
        return 1.0 - len(self._free) / self.num_blocks

    def lookup(self, block_hashes: Sequence[int]) -> list[Block]:
        """The longest run of cached blocks for these hashes, not yet referenced for the caller."""
        found = []
        if not self.enable_caching:
            return found
        for h in block_hashes:
            block = self._cached.get(h)
            if block is None:
                break
            found.append(block)
        return found

    def touch(self, blocks: Sequence[Block]) -> None:
        """Take a reference on cached blocks (revive them from the free queue if nobody held them)."""
        for block in blocks:
            if block.ref_cnt == 0:
                del self._free[block.block_id]
            block.ref_cnt += 1

    def allocate(self, count: int) -> list[Block]:
        if count > len(self._free):
            raise RuntimeError(f"asked for {count} KV blocks with {len(self._free)} free")
        out = []
        for _ in range(count):
            _, block = self._free.popitem(last=False)
            if block.block_hash is not None:
                del self._cached[block.block_hash]
                block.block_hash = None
            block.ref_cnt = 1
            out.append(block)
        return out

    def free(self, blocks: Sequence[Block]) -> None:
        """Drop one reference each; freed blocks join the LRU tail, the request's last block first out."""
        for block in reversed(blocks):
            block.ref_cnt -= 1
            if block.ref_cnt < 0:
                raise RuntimeError(f"block {block.block_id} freed twice")
            if block.ref_cnt == 0:
                self._free[block.block_id] = block

    def cache(self, block: Block, block_hash: int) -> None:
        """Publish a full block under its hash; the first writer of a hash wins."""
        if not self.enable_caching or block.block_hash is not None:
            return
        if block_hash in self._cached:
            return
        block.block_hash = block_hash
        self._cached[block_hash] = block

    def reset_cache(self) -> None:
        """Forget every cached prefix (the blocks' contents are gone); blocks in use keep their owners."""
        for block in self._cached.values():
            block.block_hash = None
        self._cached.clear()

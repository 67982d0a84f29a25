"""The block pool: refcounted fixed-size KV blocks and their free list.

The pool only counts references; the KV tensors themselves live behind the backend, indexed
by the same `BlockId`. A block is shared by whoever holds a reference to it (running
requests, radix tree nodes) and returns to the free list when the last reference is freed.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable
from typing import NewType

BlockId = NewType("BlockId", int)


class BlockPool:
    """`num_blocks` refcounted KV blocks.

    The free list is a min-heap so `allocate` always hands out the lowest free ids: the
    block ids a test sees depend only on which blocks are free, not on the order in which
    they were freed.
    """

    def __init__(self, num_blocks: int) -> None:
        if num_blocks < 1:
            raise ValueError(f"num_blocks={num_blocks} must be >= 1")
        self.num_blocks = num_blocks
        self._refcounts = [0] * num_blocks
        self._free: list[int] = list(range(num_blocks))  # already a valid heap

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return self.num_blocks - len(self._free)

    def refcount(self, block: BlockId) -> int:
        return self._refcounts[block]

    def allocate(self, num_blocks: int) -> list[BlockId] | None:
        """Take `num_blocks` free blocks (lowest ids first), each with refcount 1.

        Returns None, taking nothing, when fewer than `num_blocks` are free: running out of
        blocks is not an error, the caller decides (evict, preempt, wait).
        """
        if num_blocks < 0:
            raise ValueError(f"num_blocks={num_blocks} must be >= 0")
        if num_blocks > len(self._free):
            return None
        blocks = [BlockId(heapq.heappop(self._free)) for _ in range(num_blocks)]
        for block in blocks:
            self._refcounts[block] = 1
        return blocks

    def incref(self, block: BlockId) -> None:
        """Add a reference to a block in use (sharing it); a free block cannot be shared."""
        if self._refcounts[block] <= 0:
            raise RuntimeError(f"incref of free block {block}: bug")
        self._refcounts[block] += 1

    def free(self, blocks: Iterable[BlockId]) -> int:
        """Drop one reference to each block; returns how many went back to the free list."""
        num_returned = 0
        for block in blocks:
            if self._refcounts[block] <= 0:
                raise RuntimeError(f"free of free block {block}: bug")
            self._refcounts[block] -= 1
            if self._refcounts[block] == 0:
                heapq.heappush(self._free, block)
                num_returned += 1
        return num_returned

    def check_integrity(self) -> None:
        """Free list == exactly the blocks with refcount 0, no duplicates, valid heap."""
        free = set(self._free)
        if len(free) != len(self._free):
            raise RuntimeError("free list holds a block twice: bug")
        for i, parent in enumerate(self._free):
            for child in (2 * i + 1, 2 * i + 2):
                if child < len(self._free) and self._free[child] < parent:
                    raise RuntimeError("free list is not a heap: bug")
        for block, count in enumerate(self._refcounts):
            if count < 0 or (count == 0) != (block in free):
                raise RuntimeError(f"block {block} refcount {count} vs free list: bug")

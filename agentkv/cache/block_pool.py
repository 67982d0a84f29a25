"""The block pool: refcounted fixed-size KV blocks and their free list.

The pool only counts references; the KV tensors themselves live behind the backend, indexed
by the same `BlockId`. A block is shared by whoever holds a reference to it (running
requests, radix tree nodes) and returns to the free list when the last reference is freed.
References the prefix cache holds are counted apart too (`cache=True`), so the number of
blocks only the cache holds — what eviction could return — is kept as it changes, O(1) per
reference, instead of by walking the tree.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable
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
        self._cache_refs = [0] * num_blocks  # of a block's references, those the cache holds
        self._free: list[int] = list(range(num_blocks))  # already a valid heap
        self.num_cached_only = 0  # used blocks whose every reference is the cache's
        # Called with each block that goes back to the free list (a hybrid's state slot goes
        # with it: hal/state_store.py StateStore.release).
        self.on_free: Callable[[BlockId], None] | None = None

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

    def incref(self, block: BlockId, *, cache: bool = False) -> None:
        """Add a reference to a block in use (sharing it); a free block cannot be shared.
        `cache`: the reference is the prefix cache's."""
        if self._refcounts[block] <= 0:
            raise RuntimeError(f"incref of free block {block}: bug")
        was = self._refcounts[block] == self._cache_refs[block]
        self._refcounts[block] += 1
        if cache:
            self._cache_refs[block] += 1
        self.num_cached_only += (self._refcounts[block] == self._cache_refs[block]) - was

    def free(self, blocks: Iterable[BlockId], *, cache: bool = False) -> int:
        """Drop one reference to each block (the cache's, with `cache`); returns how many
        went back to the free list."""
        num_returned = 0
        refs, cache_refs = self._refcounts, self._cache_refs
        for block in blocks:
            if refs[block] <= 0 or (cache and cache_refs[block] <= 0):
                raise RuntimeError(f"free of free block {block}{' (cache reference)' if cache else ''}: bug")
            was = refs[block] == cache_refs[block]
            refs[block] -= 1
            if cache:
                cache_refs[block] -= 1
            if refs[block] == 0:
                heapq.heappush(self._free, block)
                num_returned += 1
                if self.on_free is not None:
                    self.on_free(block)
                self.num_cached_only -= was
            else:
                self.num_cached_only += (refs[block] == cache_refs[block]) - was
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
            if not 0 <= self._cache_refs[block] <= count:
                raise RuntimeError(f"block {block}: {self._cache_refs[block]} cache references of {count}: bug")
        cached_only = sum(1 for b, n in enumerate(self._refcounts) if n and n == self._cache_refs[b])
        if cached_only != self.num_cached_only:
            raise RuntimeError(f"num_cached_only={self.num_cached_only}, counted {cached_only}: bug")

    def cache_refcount(self, block: BlockId) -> int:
        return self._cache_refs[block]

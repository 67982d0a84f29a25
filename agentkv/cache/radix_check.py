"""The radix tree recounted the slow way, by walking every node: its integrity check (tests
call it after every mutation), the references it holds per block and its cached tokens.
Never on the engine's per-step path (the tree keeps what a step reads as it changes)."""

from __future__ import annotations

from collections import Counter
from typing import Any

from agentkv.cache.block_pool import BlockId


def check_tree(cache: Any) -> None:  # a RadixCache (duck-typed: no import cycle)
    """Raise RuntimeError("... bug") where `cache` disagrees with itself or its pool."""
    for root in cache._roots.values():
        if root.parent is not None or root.tokens or root.blocks or root.start != 0:
            raise RuntimeError(f"bad root {root}: bug")
    nodes = tree_nodes(cache)
    for node in nodes:
        parent = node.parent
        assert parent is not None
        if not node.tokens or node.start != parent.end:
            raise RuntimeError(f"{node} does not continue {parent}: bug")
        if parent.children.get(node.tokens[0]) is not node:
            raise RuntimeError(f"{node} is not its parent's child: bug")
        if len(node.blocks) != len(cache._blocks_of(node.start, node.end)):
            raise RuntimeError(f"{node} lists the wrong number of blocks: bug")
        if node.lock_ref < 0:
            raise RuntimeError(f"{node} has a negative lock count: bug")
    refs = block_refs(cache)
    for block in range(cache.pool.num_blocks):
        counted = cache.pool.cache_refcount(BlockId(block))
        if counted != refs.get(block, 0):
            raise RuntimeError(f"block {block}: tree holds {refs.get(block, 0)} refs, pool counts {counted}: bug")
    if len(nodes) != cache.num_nodes:
        raise RuntimeError(f"num_nodes={cache.num_nodes}, the tree has {len(nodes)}: bug")
    queued = {id(n) for last, _, n in cache._heap if last == n.last_access}
    missing = [n for n in nodes if cache._evictable(n) and id(n) not in queued]
    if missing:
        raise RuntimeError(f"{missing[0]} can be evicted but is not in the eviction heap: bug")


def tree_nodes(cache: Any) -> list[Any]:
    """Every non-root node of a RadixCache, parents before children, in a fixed order."""
    out: list[Any] = []
    stack = list(cache._roots.values())
    while stack:
        node = stack.pop()
        if node.parent is not None:
            out.append(node)
        stack.extend(node.children[key] for key in sorted(node.children, reverse=True))
    return out


def block_refs(cache: Any) -> Counter[BlockId]:
    """How many references a RadixCache's nodes hold on each block."""
    refs: Counter[BlockId] = Counter()
    for node in tree_nodes(cache):
        refs.update(node.blocks)
    return refs


def num_cached_tokens(cache: Any) -> int:
    return sum(len(node.tokens) for node in tree_nodes(cache))

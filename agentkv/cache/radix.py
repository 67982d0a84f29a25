"""The radix tree over token ids: token-exact prefix match, insertion, LRU eviction.

Each node owns an edge label of tokens at absolute depths [start, end) and the physical
blocks covering block indices start // bs .. (end - 1) // bs of any sequence through it:

    bs = 4      depth:  0 1 2 3 | 4 5 6 7 | 8 9
    node A [0, 6)       a a a a | a a            blocks [b0, b1]
    node C [6, 10)                    c c | c c  blocks [b1', b2]   (b1' may be b1 itself)

Adjacent nodes may both list a block at a boundary that is not block-aligned; each listing
is one pool reference. Positions of a block that lie before a node's `end` hold valid KV
for that node's prefix, so the deepest matched node covering an index has the copy that is
valid furthest. A caller only ever writes past its own `cached_len`, into blocks it owns
alone (a hit that ends mid-block is copied first: see `share`).

Entries in different namespaces (cache_salt, model, adapter) never share: one root each.
"""

from __future__ import annotations

import heapq
import itertools
import time
from collections import Counter
from collections.abc import Callable, Hashable, Sequence
from typing import NamedTuple

from agentkv.cache.block_pool import BlockId, BlockPool


class Node:
    """One edge of the tree. `lock_ref` counts locks on this node itself: the ancestors of
    a locked node always have a child, so leaf-only eviction never reaches them."""

    __slots__ = ("parent", "children", "start", "tokens", "blocks", "lock_ref", "last_access", "node_id")

    def __init__(
        self,
        parent: Node | None,
        start: int,
        tokens: tuple[int, ...],
        blocks: list[BlockId],
        node_id: int,
        last_access: int,
    ) -> None:
        self.parent = parent
        self.children: dict[int, Node] = {}
        self.start = start
        self.tokens = tokens
        self.blocks = blocks
        self.lock_ref = 0
        self.last_access = last_access
        self.node_id = node_id

    @property
    def end(self) -> int:
        return self.start + len(self.tokens)

    def __repr__(self) -> str:
        return f"Node(id={self.node_id}, [{self.start}, {self.end}), blocks={self.blocks})"


class MatchResult(NamedTuple):
    """`block_table[j]` holds valid KV for positions j*bs .. min((j+1)*bs, cached_len)-1."""

    cached_len: int
    block_table: list[BlockId]
    last_node: Node | None  # the deepest node touched; lock it to keep the path


class SharedPrefix(NamedTuple):
    """A request's own block table for a hit, and the copies the backend must run first."""

    block_table: list[BlockId]
    copies: list[tuple[BlockId, BlockId]]  # (src, dst) for backend.copy_blocks


COMPARE_SLICE = 256  # tokens compared at once, in C, by common_prefix_len


def common_prefix_len(a: Sequence[int], b: Sequence[int], start: int = 0) -> int:
    """Length of the common prefix of `a` and `b[start:]`: slices compared as tuples, then
    token by token only inside the one that differs (no Python work per matched token)."""
    limit = max(min(len(a), len(b) - start), 0)
    for i in range(0, limit, COMPARE_SLICE):
        j = min(i + COMPARE_SLICE, limit)
        if tuple(a[i:j]) != tuple(b[start + i : start + j]):
            return next(k for k in range(i, j) if a[k] != b[start + k])
    return limit


class RadixCache:
    """Token-exact prefix cache over a `BlockPool`; holds one pool reference per block
    listed by each node. Single-threaded: the scheduler calls it between steps."""

    def __init__(self, pool: BlockPool, block_size: int, now: Callable[[], float] = time.monotonic) -> None:
        if block_size < 1:
            raise ValueError(f"block_size={block_size} must be >= 1")
        self._now = now  # seconds, for pin expiry only (LRU order uses the logical clock)
        self._pins: dict[int, tuple[Node, float]] = {}  # node_id -> (locked node, expires at)
        self.pool = pool
        self.block_size = block_size
        self._roots: dict[Hashable, Node] = {}
        self._ids = itertools.count()
        self._clock = 0  # logical LRU clock, bumped by match and insert
        self.queried_tokens = 0
        self.hit_tokens = 0
        self.evicted_blocks = 0
        # Called with each node about to be dropped by `evict`, its blocks still intact (the
        # disk tier's write-back); `path_of` tells the listener what the node holds.
        self.on_evict: Callable[[Node], None] | None = None

    def root(self, namespace: Hashable) -> Node:
        """The root of `namespace` (created empty on first use)."""
        node = self._roots.get(namespace)
        if node is None:
            node = Node(None, 0, (), [], next(self._ids), 0)
            self._roots[namespace] = node
        return node

    def _blocks_of(self, start: int, end: int) -> range:
        """Block indices covering depths [start, end), end > start."""
        return range(start // self.block_size, (end - 1) // self.block_size + 1)

    def _walk(self, root: Node, tokens: Sequence[int]) -> list[tuple[Node, int]]:
        """Path of (node, matched tokens of its edge); only the last may be partial."""
        path: list[tuple[Node, int]] = []
        node, depth = root, 0
        while depth < len(tokens):
            child = node.children.get(tokens[depth])
            if child is None:
                break
            matched = common_prefix_len(child.tokens, tokens, depth)
            path.append((child, matched))
            depth += matched
            if matched < len(child.tokens):
                break
            node = child
        return path

    def _touch(self, root: Node, path: list[tuple[Node, int]]) -> None:
        self._clock += 1
        root.last_access = self._clock
        for node, _ in path:
            node.last_access = self._clock

    def match(
        self, namespace: Hashable, tokens: Sequence[int], max_len: int | None = None, *, record: bool = True
    ) -> MatchResult:
        """Longest cached token-exact prefix of `tokens[:max_len]` (no mutation of the tree).

        The engine passes max_len = len(prompt) - 1 so at least one token is left to compute
        (its logits sample the next token). `record=False` is a peek: no LRU bump, no
        counters. The caller does not own the returned blocks: `share` them, and `lock`
        `last_node` while using them.
        """
        if max_len is not None:
            tokens = tokens[: max(max_len, 0)]
        root = self.root(namespace)
        path = self._walk(root, tokens)
        table: list[BlockId] = []
        for node, matched in path:
            first = node.start // self.block_size
            for j in self._blocks_of(node.start, node.start + matched):
                block = node.blocks[j - first]
                if j < len(table):  # boundary block: the deeper node's copy wins
                    table[j] = block
                else:
                    table.append(block)
        cached_len = sum(matched for _, matched in path)
        if record:
            self._touch(root, path)
            self.queried_tokens += len(tokens)
            self.hit_tokens += cached_len
        return MatchResult(cached_len, table, path[-1][0] if path else root)

    def record_hit(self, match: MatchResult, num_queried: int) -> None:
        """Count a peeked `match` (from `record=False`) as used, once: bump the counters and
        the LRU clock of its path. The scheduler calls it when the request is admitted, so
        admission attempts that fail for lack of blocks are not counted as hits."""
        self._clock += 1
        node = match.last_node
        while node is not None:
            node.last_access = self._clock
            node = node.parent
        self.queried_tokens += num_queried
        self.hit_tokens += match.cached_len

    def share(self, match: MatchResult) -> SharedPrefix | None:
        """Build a request's own block table for `match` (mutates the pool).

        Full blocks are shared (incref'd for the request). A hit ending mid-block gets a
        fresh block plus a (src, dst) copy, because the request will write the rest of it:

            bs = 4, cached_len = 6:   | b0: 0 1 2 3 | b1: 4 5 . . |
            request table:            | b0 (shared) | new <- copy of b1, then writes 6, 7

        Returns None, taking nothing, when no block is free for the copy. The caller frees
        the table with `pool.free` when done.
        """
        num_full = match.cached_len // self.block_size
        table = list(match.block_table[:num_full])
        copies: list[tuple[BlockId, BlockId]] = []
        if match.cached_len % self.block_size:
            fresh = self.pool.allocate(1)
            if fresh is None:
                return None
            copies.append((match.block_table[num_full], fresh[0]))
        for block in table:
            self.pool.incref(block)
        table.extend(dst for _, dst in copies)
        return SharedPrefix(table, copies)

    def insert(self, namespace: Hashable, tokens: Sequence[int], block_table: Sequence[BlockId]) -> int:
        """Cache `tokens`, whose KV is in `block_table`; returns how many tokens were new.

        Mutates the tree: splits a node where `tokens` diverge inside its edge and adds one
        leaf for the new suffix, increfing the blocks it lists. Nodes already present keep
        their own blocks, so a cached prefix is never listed twice.
        """
        return self.insert_node(namespace, tokens, block_table)[0]

    def insert_node(self, namespace: Hashable, tokens: Sequence[int], block_table: Sequence[BlockId]):
        """`insert`, also returning the node `match(namespace, tokens).last_node` would find."""
        if not tokens:
            return 0, self.root(namespace)
        num_needed = (len(tokens) - 1) // self.block_size + 1
        if len(block_table) < num_needed:
            raise ValueError(f"block_table has {len(block_table)} blocks, {len(tokens)} tokens need {num_needed}")
        root = self.root(namespace)
        path = self._walk(root, tokens)
        self._touch(root, path)
        depth = sum(matched for _, matched in path)
        if depth == len(tokens):
            return 0, path[-1][0]
        parent = root
        if path:
            node, matched = path[-1]
            parent = self._split(node, matched) if matched < len(node.tokens) else node
        blocks = [block_table[j] for j in self._blocks_of(depth, len(tokens))]
        for block in blocks:
            self.pool.incref(block)
        leaf = Node(parent, depth, tuple(tokens[depth:]), blocks, next(self._ids), self._clock)
        parent.children[tokens[depth]] = leaf
        return len(tokens) - depth, leaf

    def _split(self, node: Node, num_upper: int) -> Node:
        """Split `node` after `num_upper` tokens; returns the new upper node.

        `node` stays the lower part so that locks held on it keep protecting what they
        locked (the new upper node is its parent, never a leaf while it lives):

            before:  parent -> node [s, e)
            after:   parent -> upper [s, s+k) -> node [s+k, e)

        When s+k is not block-aligned both halves list the boundary block (one more ref).
        """
        assert 0 < num_upper < len(node.tokens) and node.parent is not None
        split_at = node.start + num_upper
        first = node.start // self.block_size
        upper_blocks = node.blocks[: (split_at - 1) // self.block_size - first + 1]
        lower_blocks = node.blocks[split_at // self.block_size - first :]
        if split_at % self.block_size:
            self.pool.incref(lower_blocks[0])
        upper = Node(node.parent, node.start, node.tokens[:num_upper], upper_blocks, next(self._ids), node.last_access)
        node.parent.children[node.tokens[0]] = upper
        node.parent = upper
        node.start, node.tokens, node.blocks = split_at, node.tokens[num_upper:], lower_blocks
        upper.children[node.tokens[0]] = node
        return upper

    def lock(self, node: Node) -> None:
        """Protect `node` and (since they are then never leaves) its ancestors from evict."""
        node.lock_ref += 1

    def unlock(self, node: Node) -> None:
        if node.lock_ref <= 0:
            raise RuntimeError(f"unlock of unlocked {node}: bug")
        node.lock_ref -= 1

    def pin(self, namespace: Hashable, tokens: Sequence[int], ttl_s: float) -> int:
        """Keep the cached prefix of `tokens` from eviction for `ttl_s` seconds (mutates: locks
        the deepest node of the match once, or extends its expiry); returns the pinned length,
        0 when nothing of `tokens` is cached. A pin holds that node whole, and its ancestors."""
        if not ttl_s > 0:
            raise ValueError(f"ttl_s={ttl_s!r} is out of range: allowed > 0 seconds")
        self.unpin_expired()
        match = self.match(namespace, tokens, record=False)
        node = match.last_node
        if match.cached_len == 0 or node is None or node.parent is None:
            return 0
        expires_at = self._now() + ttl_s
        held = self._pins.get(node.node_id)
        if held is None:
            self.lock(node)
        else:
            expires_at = max(expires_at, held[1])
        self._pins[node.node_id] = (node, expires_at)
        return match.cached_len

    def unpin_expired(self) -> int:
        """Unlock the pins whose time is up (mutates); returns how many were released."""
        now = self._now()
        expired = [key for key, (_, until) in self._pins.items() if until <= now]
        for key in expired:
            self.unlock(self._pins.pop(key)[0])
        return len(expired)

    @property
    def num_pins(self) -> int:
        return len(self._pins)

    def _nodes(self) -> list[Node]:
        """Every non-root node, parents before children, in a deterministic order."""
        out: list[Node] = []
        stack = list(self._roots.values())
        while stack:
            node = stack.pop()
            if node.parent is not None:
                out.append(node)
            stack.extend(node.children[key] for key in sorted(node.children, reverse=True))
        return out

    @staticmethod
    def _evictable(node: Node) -> bool:
        return node.parent is not None and not node.children and node.lock_ref == 0

    def evict(self, num_blocks: int) -> int:
        """Drop least-recently-used unlocked leaves until `num_blocks` blocks returned to
        the pool (or nothing is left to drop); returns how many actually returned.

        A dropped leaf's parent becomes a candidate as soon as it is a leaf. Ties in the
        logical clock go to the older node. Blocks still held by a request or a neighbour
        node lose one reference but do not count as returned. Expired pins are released
        first; live ones hold their nodes.
        """
        self.unpin_expired()
        heap = [(n.last_access, n.node_id, n) for n in self._nodes() if self._evictable(n)]
        heapq.heapify(heap)
        num_freed = 0
        while num_freed < num_blocks and heap:
            _, _, node = heapq.heappop(heap)
            parent = node.parent
            assert parent is not None
            if self.on_evict is not None:
                self.on_evict(node)
            del parent.children[node.tokens[0]]
            node.parent = None
            num_freed += self.pool.free(node.blocks)
            node.blocks = []
            if self._evictable(parent):
                heapq.heappush(heap, (parent.last_access, parent.node_id, parent))
        self.evicted_blocks += num_freed
        # Drop empty namespaces too: a per-request namespace must not leak its root.
        for namespace, root in list(self._roots.items()):
            if not root.children and not root.lock_ref:
                del self._roots[namespace]
        return num_freed

    def path_of(self, node: Node) -> tuple[Hashable, list[int]]:
        """The namespace of a node in the tree and the tokens from its root to `node.end`."""
        edges, root = [], node
        while root.parent is not None:
            edges.append(root.tokens)
            root = root.parent
        namespace = next(ns for ns, r in self._roots.items() if r is root)
        return namespace, [t for edge in reversed(edges) for t in edge]

    def block_refs(self) -> Counter[BlockId]:
        """How many references the tree holds on each block."""
        refs: Counter[BlockId] = Counter()
        for node in self._nodes():
            refs.update(node.blocks)
        return refs

    @property
    def num_cached_tokens(self) -> int:
        return sum(len(node.tokens) for node in self._nodes())

    def check_integrity(self) -> None:
        """Spans, child keys and parent links agree; each node lists exactly the blocks of
        its span; the pool holds at least the tree's references (requests hold the rest)."""
        for root in self._roots.values():
            if root.parent is not None or root.tokens or root.blocks or root.start != 0:
                raise RuntimeError(f"bad root {root}: bug")
        for node in self._nodes():
            parent = node.parent
            assert parent is not None
            if not node.tokens or node.start != parent.end:
                raise RuntimeError(f"{node} does not continue {parent}: bug")
            if parent.children.get(node.tokens[0]) is not node:
                raise RuntimeError(f"{node} is not its parent's child: bug")
            if len(node.blocks) != len(self._blocks_of(node.start, node.end)):
                raise RuntimeError(f"{node} lists the wrong number of blocks: bug")
            if node.lock_ref < 0:
                raise RuntimeError(f"{node} has a negative lock count: bug")
        for block, count in self.block_refs().items():
            if self.pool.refcount(block) < count:
                raise RuntimeError(f"block {block}: tree holds {count} refs, pool {self.pool.refcount(block)}: bug")

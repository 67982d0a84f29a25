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
No per-step cost grows with the tree: eviction pops a heap of candidate leaves kept as the
tree changes (stale entries are skipped, and dropped when the heap passes twice the tree),
and the pool counts the blocks only the tree holds (`BlockPool.num_cached_only`).
"""

from __future__ import annotations

import heapq
import itertools
import time
from collections.abc import Callable, Hashable, Sequence
from typing import NamedTuple

from agentkv.cache.block_pool import BlockId, BlockPool
from agentkv.cache.pins import Pin, PinBudget, PinTable
from agentkv.cache.radix_check import check_tree, tree_nodes
from agentkv.cache.tokens import common_prefix_len


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


class RadixCache:
    """Token-exact prefix cache over a `BlockPool`; holds one pool reference per block
    listed by each node. Single-threaded: the scheduler calls it between steps."""

    def __init__(self, pool: BlockPool, block_size: int, now: Callable[[], float] = time.monotonic) -> None:
        if block_size < 1:
            raise ValueError(f"block_size={block_size} must be >= 1")
        self._now = now  # seconds, for pin expiry only (LRU order uses the logical clock)
        self.pins = PinTable()  # read-only outside: pin and unpin_expired change it
        self.pool = pool
        self.block_size = block_size
        self._roots: dict[Hashable, Node] = {}
        self._root_ns: dict[int, Hashable] = {}  # root node_id -> its namespace
        self._heap: list[tuple[int, int, Node]] = []  # eviction candidates (last_access, node_id)
        self.num_nodes = 0  # non-root nodes in the tree
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
            self._root_ns[node.node_id] = namespace
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
            self._offer(node)

    def _offer(self, node: Node) -> None:
        """Make `node` an eviction candidate at its current LRU time, if it can be evicted."""
        if self._evictable(node):
            heapq.heappush(self._heap, (node.last_access, node.node_id, node))

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
            self._offer(node)
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
        Mutates: splits a node where `tokens` diverge inside its edge and adds one leaf for
        the new suffix, increfing the blocks it lists (a cached prefix is never listed twice)."""
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
            self.pool.incref(block, cache=True)
        leaf = Node(parent, depth, tuple(tokens[depth:]), blocks, next(self._ids), self._clock)
        parent.children[tokens[depth]] = leaf
        self.num_nodes += 1
        self._offer(leaf)
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
            self.pool.incref(lower_blocks[0], cache=True)
        upper = Node(node.parent, node.start, node.tokens[:num_upper], upper_blocks, next(self._ids), node.last_access)
        self.num_nodes += 1
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
        self._offer(node)

    def pin(self, namespace: Hashable, tokens: Sequence[int], ttl_s: float, budget: PinBudget | None = None) -> int:
        """Keep the cached prefix of `tokens` from eviction for `ttl_s` seconds (mutates: locks
        the deepest node of the match once, or extends its expiry); returns the pinned length,
        0 when nothing of `tokens` is cached or when a new pin would pass `budget` (blocks held
        by pins in all and in `namespace`). A pin holds that node whole, and its ancestors."""
        if not ttl_s > 0:
            raise ValueError(f"ttl_s={ttl_s!r} is out of range: allowed > 0 seconds")
        self.unpin_expired()
        match = self.match(namespace, tokens, record=False)
        node = match.last_node
        if match.cached_len == 0 or node is None or node.parent is None:
            return 0
        expires_at = self._now() + ttl_s
        held = self.pins.get(node)
        if held is None:
            num_blocks = -(-node.end // self.block_size)
            if budget is not None and not self.pins.fits(namespace, num_blocks, budget):
                return 0
            self.lock(node)
            held = Pin(node, expires_at, namespace, num_blocks)
        self.pins.put(held._replace(expires_at=max(expires_at, held.expires_at)))
        return match.cached_len

    def unpin_expired(self, *, everything: bool = False) -> int:
        """Unlock the pins whose time is up (all, with `everything`); returns how many."""
        nodes = self.pins.take_expired(self._now(), everything)
        for node in nodes:
            self.unlock(node)
        return len(nodes)

    @property
    def num_pins(self) -> int:
        return len(self.pins)

    def pin_wait_s(self) -> float | None:
        """Seconds until the earliest live pin expires (None without pins)."""
        expiry = self.pins.next_expiry()
        return None if expiry is None else max(0.0, expiry - self._now())

    def namespaces(self) -> list[Hashable]:
        return list(self._roots)

    def evict_namespace(self, namespace: Hashable) -> int:
        """Drop everything `namespace` holds that no request locks, its pins released and
        nothing written back (a flush: mutates); returns the blocks returned to the pool."""
        for node in self.pins.take_namespace(namespace):
            self.unlock(node)
        root, on_evict, self.on_evict = self._roots.get(namespace), self.on_evict, None
        order, stack = [], [root] if root is not None else []
        while stack:  # parents before children; reversed, every child goes before its parent
            node = stack.pop()
            order.append(node)
            stack.extend(node.children.values())
        num_freed = sum(self._drop(n) for n in reversed(order) if self._evictable(n))
        self.on_evict = on_evict
        self.evicted_blocks += num_freed
        return num_freed

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
        num_freed = 0
        heap = self._heap
        while num_freed < num_blocks and heap:
            last_access, _, node = heapq.heappop(heap)
            if last_access != node.last_access or not self._evictable(node):
                continue  # stale: touched, locked, grown or dropped since it was offered
            num_freed += self._drop(node)
        self.evicted_blocks += num_freed
        if len(heap) > 2 * self.num_nodes + 64:
            self._heap = [(n.last_access, n.node_id, n) for n in tree_nodes(self) if self._evictable(n)]
            heapq.heapify(self._heap)
        return num_freed

    def _drop(self, node: Node) -> int:
        """Remove the leaf `node` (its blocks' cache references too); returns blocks freed."""
        parent = node.parent
        assert parent is not None
        if self.on_evict is not None:
            self.on_evict(node)
        del parent.children[node.tokens[0]]
        node.parent = None
        self.num_nodes -= 1
        num_freed = self.pool.free(node.blocks, cache=True)
        node.blocks = []
        if parent.parent is None:
            # Drop an empty namespace too: a per-request namespace must not leak its root.
            if not parent.children and not parent.lock_ref:
                del self._roots[self._root_ns.pop(parent.node_id)]
        else:
            self._offer(parent)
        return num_freed

    def path_of(self, node: Node) -> tuple[Hashable, list[int]]:
        """The namespace of a node in the tree and the tokens from its root to `node.end`."""
        edges, root = [], node
        while root.parent is not None:
            edges.append(root.tokens)
            root = root.parent
        return self._root_ns[root.node_id], [t for edge in reversed(edges) for t in edge]

    def check_integrity(self) -> None:
        """Everything kept incrementally, recounted (cache/radix_check.py)."""
        check_tree(self)

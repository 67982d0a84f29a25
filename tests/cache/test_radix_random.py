"""RadixCache under random operation sequences, against outside oracles.

Each block carries a fake KV payload: position p of a sequence s stores the tuple s[:p+1]
(KV depends on the whole prefix). A match is right when its length equals the brute-force
longest common prefix over what is cached, and every position it covers reads back the
query's own prefix from the block table it returned. A request writing into a block anyone
else references would corrupt some payload and be caught.
"""

from hypothesis import given, settings
from hypothesis import strategies as st

from agentkv.cache import BlockPool, RadixCache, common_prefix_len
from agentkv.cache.radix_check import num_cached_tokens, tree_nodes

BS = 3
NUM_BLOCKS = 24

BASES = (
    [0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 1, 2],
    [0, 1, 2, 2, 2, 1, 0, 0, 1, 1, 2, 0],
    [1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1],
)
# sequences branch off a few shared bases at any depth, so splits land on and off blocks
tokens_st = st.builds(
    lambda base, cut, tail: (BASES[base][:cut] + tail) or [0],
    st.integers(0, 2),
    st.integers(0, 12),
    st.lists(st.integers(0, 2), max_size=6),
)
serve_st = st.tuples(st.just("serve"), st.integers(0, 1), tokens_st, st.booleans())
match_st = st.tuples(st.just("match"), st.integers(0, 1), tokens_st, st.booleans())
op_st = st.one_of(
    serve_st,
    serve_st,
    serve_st,
    match_st,
    match_st,
    st.tuples(st.just("unlock"), st.integers(0, 5)),
    st.tuples(st.just("evict"), st.integers(0, 8)),
)


class World:
    def __init__(self):
        self.pool = BlockPool(NUM_BLOCKS)
        self.cache = RadixCache(self.pool, BS)
        self.payload: dict[int, dict[int, tuple]] = {}
        self.cached: dict[int, list[list[int]]] = {0: [], 1: []}  # brute-force model
        self.locks: list[tuple[int, list[int], object]] = []

    def check(self):
        self.pool.check_integrity()
        self.cache.check_integrity()

    def verify_match(self, ns, query, max_len):
        match = self.cache.match(ns, query, max_len=max_len)
        query = query[:max_len]
        expected = max((common_prefix_len(t, query) for t in self.cached[ns]), default=0)
        assert match.cached_len == expected
        assert len(match.block_table) == (expected + BS - 1) // BS
        for p in range(expected):
            assert self.payload[match.block_table[p // BS]][p % BS] == tuple(query[: p + 1])
        return match

    def allocate(self, num):
        blocks = self.pool.allocate(num)
        for b in blocks or ():
            self.payload[b] = {}
        return blocks

    def serve(self, ns, tokens, lock):
        match = self.verify_match(ns, tokens, len(tokens) - 1)
        shared = self.cache.share(match)
        if shared is None:
            return
        for src, dst in shared.copies:
            self.payload[dst] = dict(self.payload[src])
        rest = self.allocate((len(tokens) + BS - 1) // BS - len(shared.block_table))
        if rest is None:
            self.pool.free(shared.block_table)
            return
        table = shared.block_table + rest
        for p in range(match.cached_len, len(tokens)):
            assert self.pool.refcount(table[p // BS]) == 1, "write into a shared block"
            self.payload[table[p // BS]][p % BS] = tuple(tokens[: p + 1])
        self.cache.insert(ns, tokens, table)
        self.check()
        self.cached[ns].append(list(tokens))
        if lock:
            node = self.cache.match(ns, tokens, record=False).last_node
            self.cache.lock(node)
            self.locks.append((ns, list(tokens), node))
        self.pool.free(table)

    def evict(self, num):
        num_free = self.pool.num_free
        num_freed = self.cache.evict(num)
        assert num_freed == self.pool.num_free - num_free
        if num_freed < num:  # it stopped early only because nothing was left to drop
            assert all(n.children or n.lock_ref for n in tree_nodes(self.cache))
        for ns, seqs in self.cached.items():
            kept = []
            for t in seqs:
                cached_len = self.cache.match(ns, t, record=False).cached_len
                kept.append(t[:cached_len])
            self.cached[ns] = [t for t in kept if t]
        for ns, tokens, _ in self.locks:
            assert self.cache.match(ns, tokens, record=False).cached_len == len(tokens)


@settings(max_examples=150, deadline=None)
@given(st.lists(op_st, min_size=4, max_size=40))
def test_random_operations_keep_integrity_and_match_brute_force(ops):
    world = World()
    for op in ops:
        if op[0] == "serve":
            world.serve(op[1], op[2], op[3])
        elif op[0] == "match":
            world.verify_match(op[1], op[2], len(op[2]) - 1 if op[3] else None)
        elif op[0] == "unlock" and world.locks:
            _, _, node = world.locks.pop(op[1] % len(world.locks))
            world.cache.unlock(node)
        elif op[0] == "evict":
            world.evict(op[1])
        world.check()
    for _, _, node in world.locks:
        world.cache.unlock(node)
    world.cache.evict(NUM_BLOCKS)
    world.check()
    assert world.pool.num_free == NUM_BLOCKS
    assert num_cached_tokens(world.cache) == 0

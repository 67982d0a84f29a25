"""RadixCache: exact tree shapes, block tables, copy-on-write, namespaces, LRU eviction."""

import pytest

from agentkv.cache import BlockPool, RadixCache

BS = 4
A = list(range(1, 11))  # 10 tokens: blocks 0..2, the last one partial


def make(num_blocks=16):
    pool = BlockPool(num_blocks)
    return pool, RadixCache(pool, BS)


def check(pool, cache):
    pool.check_integrity()
    cache.check_integrity()


def serve(pool, cache, tokens, ns=None):
    """One request: match, share (COW), allocate the rest, insert, free. Returns
    (table, copies) as the request saw them."""
    match = cache.match(ns, tokens, max_len=len(tokens) - 1)
    shared = cache.share(match)
    num_new = (len(tokens) + BS - 1) // BS - len(shared.block_table)
    table = shared.block_table + pool.allocate(num_new)
    check(pool, cache)
    cache.insert(ns, tokens, table)
    check(pool, cache)
    pool.free(table)
    check(pool, cache)
    return table, shared.copies


def shape(node):
    """(start, end, blocks, {first token: child shape})"""
    return (node.start, node.end, node.blocks, {k: shape(c) for k, c in sorted(node.children.items())})


def refcounts(pool):
    return [pool.refcount(b) for b in range(pool.num_blocks)]


def test_insert_then_match_exact_block_table():
    pool, cache = make(8)
    table = pool.allocate(3)
    assert cache.insert("ns", A, table) == 10
    check(pool, cache)
    assert refcounts(pool) == [2, 2, 2, 0, 0, 0, 0, 0]
    pool.free(table)
    check(pool, cache)
    assert shape(cache.root("ns")) == (0, 0, [], {1: (0, 10, [0, 1, 2], {})})
    match = cache.match("ns", A)
    assert (match.cached_len, match.block_table) == (10, [0, 1, 2])
    assert match.last_node is cache.root("ns").children[1]
    match = cache.match("ns", A, max_len=len(A) - 1)
    assert (match.cached_len, match.block_table) == (9, [0, 1, 2])
    match = cache.match("ns", A[:4] + [77])
    assert (match.cached_len, match.block_table) == (4, [0])
    assert cache.insert("ns", A[:7], [0, 1]) == 0  # a cached prefix adds nothing
    check(pool, cache)
    assert refcounts(pool) == [1, 1, 1, 0, 0, 0, 0, 0]


def test_mid_block_hit_copies_and_split_shares_the_boundary_block():
    pool, cache = make(8)
    serve(pool, cache, A)
    b = A[:6] + [99, 98, 97, 96]
    table, copies = serve(pool, cache, b)
    # the hit ends at 6, inside block 1: block 0 shared, block 1 copied into a fresh 3
    assert table == [0, 3, 4]
    assert copies == [(1, 3)]
    assert shape(cache.root(None)) == (
        0,
        0,
        [],
        {
            1: (
                0,
                6,
                [0, 1],
                {
                    7: (6, 10, [1, 2], {}),
                    99: (6, 10, [3, 4], {}),
                },
            )
        },
    )
    assert refcounts(pool) == [1, 2, 1, 1, 1, 0, 0, 0]
    assert cache.match(None, b).block_table == [0, 3, 4]
    assert cache.match(None, b[:7]).block_table == [0, 3]
    assert cache.match(None, b[:6] + [5]).block_table == [0, 1]
    assert cache.match(None, A).block_table == [0, 1, 2]


def test_aligned_hit_shares_without_copy():
    pool, cache = make(8)
    serve(pool, cache, A)
    table, copies = serve(pool, cache, A[:4] + [50, 51, 52])
    assert (table, copies) == ([0, 3], [])
    assert shape(cache.root(None)) == (
        0,
        0,
        [],
        {
            1: (
                0,
                4,
                [0],
                {
                    5: (4, 10, [1, 2], {}),
                    50: (4, 7, [3], {}),
                },
            )
        },
    )
    assert refcounts(pool) == [1, 1, 1, 1, 0, 0, 0, 0]


def test_share_returns_none_when_no_block_for_the_copy():
    pool, cache = make(3)
    serve(pool, cache, A)
    match = cache.match(None, A[:6])
    assert cache.share(match) is None
    check(pool, cache)
    assert refcounts(pool) == [1, 1, 1]


def test_namespaces_never_share():
    pool, cache = make(8)
    serve(pool, cache, A, ns="a")
    match = cache.match("b", A)
    assert (match.cached_len, match.block_table) == (0, [])
    assert match.last_node is cache.root("b")
    table, copies = serve(pool, cache, A, ns="b")
    assert (table, copies) == ([3, 4, 5], [])
    assert cache.match("a", A).block_table == [0, 1, 2]


def test_counters_and_peek():
    pool, cache = make(8)
    serve(pool, cache, A)  # queried 9, hit 0
    cache.match(None, A[:5] + [0])
    assert (cache.queried_tokens, cache.hit_tokens) == (15, 5)
    cache.match(None, A, record=False)
    assert (cache.queried_tokens, cache.hit_tokens) == (15, 5)


def test_lru_eviction_order_follows_the_logical_clock():
    pool, cache = make(8)
    x, y, z = [10, 11, 12, 13], [20, 21, 22, 23], [30, 31, 32, 33]
    for seq in (x, y, z):
        serve(pool, cache, seq)  # blocks 0, 1, 2
    cache.match(None, x)  # x becomes the most recent
    assert cache.evict(1) == 1
    check(pool, cache)
    assert sorted(cache.root(None).children) == [10, 30]
    assert refcounts(pool)[:3] == [1, 0, 1]
    assert cache.evict(1) == 1
    check(pool, cache)
    assert sorted(cache.root(None).children) == [10]
    assert cache.evicted_blocks == 2
    assert cache.evict(5) == 1
    check(pool, cache)
    assert pool.num_free == 8


def test_locked_nodes_are_not_evicted():
    pool, cache = make(8)
    serve(pool, cache, [10, 11, 12, 13])
    serve(pool, cache, [20, 21, 22, 23])
    node = cache.match(None, [10, 11]).last_node
    cache.lock(node)
    assert cache.evict(8) == 1
    check(pool, cache)
    assert list(cache.root(None).children) == [10]
    cache.unlock(node)
    assert cache.evict(8) == 1
    assert pool.num_free == 8
    with pytest.raises(RuntimeError):
        cache.unlock(node)


def test_lock_survives_a_split_of_the_locked_node():
    pool, cache = make(8)
    serve(pool, cache, A)
    node = cache.match(None, A).last_node
    cache.lock(node)
    serve(pool, cache, A[:6] + [99])  # splits the locked node at 6
    assert (node.start, node.end) == (6, 10)
    assert cache.evict(8) == 1  # only the new leaf [6, 7): its own block 3
    check(pool, cache)
    assert shape(cache.root(None)) == (0, 0, [], {1: (0, 6, [0, 1], {7: (6, 10, [1, 2], {})})})


def test_parents_are_evicted_after_their_children_and_shared_blocks_count_once():
    pool, cache = make(8)
    table = pool.allocate(3)
    cache.insert(None, A[:6], table)  # progressive insertion: [0, 6) then [6, 10)
    cache.insert(None, A, table)
    pool.free(table)
    check(pool, cache)
    assert shape(cache.root(None)) == (0, 0, [], {1: (0, 6, [0, 1], {7: (6, 10, [1, 2], {})})})
    assert refcounts(pool)[:3] == [1, 2, 1]
    assert cache.evict(1) == 1  # the leaf: block 1 is still the parent's
    check(pool, cache)
    assert refcounts(pool)[:3] == [1, 1, 0]
    assert cache.evict(1) == 2
    check(pool, cache)
    assert pool.num_free == 8 and cache.evicted_blocks == 3


def test_insert_rejects_a_short_block_table():
    pool, cache = make(8)
    with pytest.raises(ValueError, match="need 3"):
        cache.insert(None, A, pool.allocate(2))


def test_evict_drops_empty_unlocked_namespaces():
    pool, cache = make(8)
    serve(pool, cache, A, ns="gone")
    kept = cache.root("kept")
    cache.lock(kept)
    cache.evict(8)
    check(pool, cache)
    assert set(cache._roots) == {"kept"}
    cache.unlock(kept)


@pytest.mark.parametrize("diff_at", [0, 1, 255, 256, 257, 511, 700, None])
def test_common_prefix_len_across_compare_slices(diff_at):
    """The prefix length is exact wherever the first difference falls relative to the
    slices compared at once, for a tuple against a list and with an offset into `b`."""
    from agentkv.cache import common_prefix_len

    a = tuple(range(5, 805))
    b = [7, 7, 7, *a]
    if diff_at is not None:
        b[3 + diff_at] = -1
    want = len(a) if diff_at is None else diff_at
    assert common_prefix_len(a, b, 3) == want
    assert common_prefix_len(list(a), tuple(b), 3) == want
    assert common_prefix_len(a[:300], b, 3) == min(want, 300)
    assert common_prefix_len(a, b[: 3 + 100], 3) == min(want, 100)
    assert common_prefix_len(a, b, len(b) + 5) == 0


def test_insert_node_returns_the_node_match_finds():
    """insert_node's node is match(...).last_node: after a new leaf, after a split, and
    when everything was cached already (one walk instead of insert + match)."""
    pool, cache = make(32)
    table = pool.allocate(3)
    num_new, node = cache.insert_node(None, A, table)
    assert num_new == 10 and node is cache.match(None, A).last_node
    num_new, node = cache.insert_node(None, A[:6], table)
    assert num_new == 0 and node is cache.match(None, A[:6]).last_node
    other = [*A[:5], 99, 98]
    num_new, node = cache.insert_node(None, other, [table[0], *pool.allocate(1)])
    assert num_new == 2 and node is cache.match(None, other).last_node and node.start == 5
    assert cache.insert_node(None, [], table) == (0, cache.root(None))
    check(pool, cache)

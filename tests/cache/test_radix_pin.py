"""RadixCache pins: a pinned prefix survives eviction until its TTL runs out, on a fake clock."""

import pytest

from agentkv.cache import BlockPool, RadixCache

BS = 4
A = list(range(1, 11))  # 10 tokens, blocks 0..2
B = [50, 51, 52, 53, 54]


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def make():
    pool, clock = BlockPool(8), Clock()
    return pool, RadixCache(pool, BS, now=clock), clock


def cache_tokens(pool, cache, tokens):
    table = pool.allocate((len(tokens) + BS - 1) // BS)
    cache.insert(None, tokens, table)
    pool.free(table)


def test_pinned_prefix_outlives_eviction_until_its_ttl():
    pool, cache, clock = make()
    cache_tokens(pool, cache, A)
    cache_tokens(pool, cache, B)
    assert cache.pin(None, A[:7], ttl_s=300) == 7
    assert cache.evict(8) == 2  # B's two blocks only
    pool.check_integrity()
    cache.check_integrity()
    assert cache.match(None, A, record=False).cached_len == 10
    clock.t += 299.9
    assert cache.evict(8) == 0 and cache.num_pins == 1
    clock.t += 0.2
    assert cache.evict(8) == 3 and cache.num_pins == 0  # expired: A goes too
    assert pool.num_free == 8
    cache.check_integrity()


def test_control_unpinned_prefix_is_evicted():
    pool, cache, _ = make()
    cache_tokens(pool, cache, A)
    assert cache.evict(8) == 3 and cache.match(None, A, record=False).cached_len == 0


def test_repin_extends_and_locks_once():
    pool, cache, clock = make()
    cache_tokens(pool, cache, A)
    cache.pin(None, A, ttl_s=60)
    clock.t += 50
    cache.pin(None, A, ttl_s=60)  # refreshed: now expires at +110
    node = cache.match(None, A, record=False).last_node
    assert node.lock_ref == 1 and cache.num_pins == 1
    clock.t += 59
    assert cache.evict(8) == 0
    clock.t += 2
    assert cache.evict(8) == 3


def test_pin_of_nothing_cached_and_bad_ttl():
    pool, cache, _ = make()
    assert cache.pin(None, A, ttl_s=300) == 0 and cache.num_pins == 0
    with pytest.raises(ValueError, match="ttl_s=0"):
        cache.pin(None, A, ttl_s=0)


def test_pin_survives_a_split_of_the_pinned_node():
    pool, cache, clock = make()
    cache_tokens(pool, cache, A)
    cache.pin(None, A, ttl_s=10)
    cache_tokens(pool, cache, A[:6] + [99])  # splits the pinned node at 6
    assert cache.evict(8) == 1  # only the new leaf
    cache.check_integrity()
    clock.t += 11
    assert cache.evict(8) == 3

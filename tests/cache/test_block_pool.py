"""BlockPool: allocation order, refcounts, the free list, capacity."""

import pytest

from agentkv.cache import BlockPool


def test_allocate_lowest_ids_first_and_refcount_one():
    pool = BlockPool(4)
    assert pool.allocate(2) == [0, 1]
    pool.check_integrity()
    assert [pool.refcount(b) for b in range(4)] == [1, 1, 0, 0]
    assert (pool.num_free, pool.num_used) == (2, 2)


def test_allocate_returns_none_and_takes_nothing_when_short():
    pool = BlockPool(3)
    assert pool.allocate(2) == [0, 1]
    assert pool.allocate(2) is None
    pool.check_integrity()
    assert pool.num_free == 1
    assert pool.allocate(0) == []


def test_free_order_does_not_change_allocation_order():
    pool = BlockPool(5)
    pool.allocate(5)
    assert pool.free([3, 1, 4]) == 3
    pool.check_integrity()
    assert pool.allocate(2) == [1, 3]
    pool.check_integrity()


def test_shared_block_returns_only_at_refcount_zero():
    pool = BlockPool(2)
    (block,) = pool.allocate(1)
    pool.incref(block)
    pool.check_integrity()
    assert pool.refcount(block) == 2
    assert pool.free([block]) == 0
    pool.check_integrity()
    assert (pool.refcount(block), pool.num_free) == (1, 1)
    assert pool.free([block]) == 1
    pool.check_integrity()
    assert pool.num_free == 2


def test_misuse_is_a_bug():
    pool = BlockPool(2)
    with pytest.raises(RuntimeError):
        pool.free([0])
    with pytest.raises(RuntimeError):
        pool.incref(1)
    with pytest.raises(ValueError, match="num_blocks=0"):
        BlockPool(0)
    with pytest.raises(ValueError, match="num_blocks=-1"):
        pool.allocate(-1)

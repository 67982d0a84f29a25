"""Prefix-cache hit counters count a hit once, when the request is admitted, however many
steps its admission had to wait for blocks."""

from tests.sched.test_scheduler import assert_idle_and_empty, drain, make, seq, step

A = list(range(1, 9))  # 8 tokens: two full blocks of 4


def test_hit_is_counted_once_at_admission_not_per_failed_attempt():
    sched, model = make(num_blocks=9)
    sched.add(seq(0, A, max_tokens=1))
    drain(sched, model)  # A's 8 tokens now cached: 2 blocks held by the tree
    queried_before, hits_before = sched.cache.queried_tokens, sched.cache.hit_tokens
    sched.add(seq(1, range(50, 70), max_tokens=4))  # 20 tokens, growing to 6 blocks
    step(sched, model)
    # C hits A's 8 tokens but needs 3 more blocks while B holds 6 of the 9: it waits.
    c = seq(2, A + list(range(100, 112)), max_tokens=1)
    sched.add(c)
    waited = 0
    while sched.waiting:
        step(sched, model)
        waited += 1
    assert waited > 2  # several failed admission attempts happened
    assert c.cached_len == 8
    assert sched.cache.hit_tokens - hits_before == 8
    assert sched.cache.queried_tokens - queried_before == 19 + 19  # B's and C's, once each
    drain(sched, model)
    assert_idle_and_empty(sched)

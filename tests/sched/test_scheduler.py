"""Scheduler: exact chunk lists, prefix hits, in-flight dedupe, preemption, abort.

The "model" is a fake backend over the same block tables: a chunk writes, for position p,
the payload all_ids[:p+1] into its block, and first reads back every earlier position
through the block table (what attention would see). The next token is a pure function of
the context, so any stale or misplaced KV, and any recompute that changes the context,
shows up as a wrong read or a different output.
"""

from collections import defaultdict

import pytest

from agentkv.cache import BlockPool, RadixCache
from agentkv.sched import CacheView, Scheduler, SchedulerConfig, SeqId, SeqStatus, Sequence


def next_token(ids):
    return (sum(ids) * 31 + len(ids)) % 97


def expected_output(prompt, max_tokens):
    ids = list(prompt)
    for _ in range(max_tokens):
        ids.append(next_token(ids))
    return ids[len(prompt) :]


class FakeModel:
    def __init__(self, block_size):
        self.bs = block_size
        self.kv = defaultdict(dict)

    def run(self, out):
        for src, dst in out.copies:
            self.kv[dst] = dict(self.kv[src])
        sampled = {}
        for chunk in out.chunks:
            if chunk.seq.status is not SeqStatus.RUNNING:
                continue  # finished or aborted after schedule(): the runner skips it
            ids, table = chunk.seq.all_ids, chunk.seq.block_table
            for p in range(chunk.start):
                assert self.kv[table[p // self.bs]].get(p % self.bs) == tuple(ids[: p + 1])
            for p in range(chunk.start, chunk.start + chunk.num_tokens):
                self.kv[table[p // self.bs]][p % self.bs] = tuple(ids[: p + 1])
            if chunk.samples:
                sampled[chunk.seq.seq_id] = next_token(ids)
        return sampled


def make(num_blocks=64, **kw):
    view = CacheView(block_size=kw.pop("block_size", 4), enable_prefix_cache=True)
    pool = BlockPool(num_blocks)
    cache = RadixCache(pool, view.block_size)
    return Scheduler(SchedulerConfig(**kw), pool, cache, view), FakeModel(view.block_size)


def seq(seq_id, prompt, max_tokens=2, ns=None):
    return Sequence(SeqId(seq_id), list(prompt), max_tokens, namespace=ns)


def step(sched, model):
    """One engine step; returns the chunks as (seq_id, start, num_tokens, samples)."""
    out = sched.schedule()
    sched.check_integrity()
    sched.on_tokens(model.run(out))
    sched.check_integrity()
    for chunk in out.chunks:
        s = chunk.seq
        if s.status is SeqStatus.RUNNING and len(s.output_ids) >= s.max_tokens:
            sched.finish(s.seq_id, "length")
            sched.check_integrity()
    return [(c.seq.seq_id, c.start, c.num_tokens, c.samples) for c in out.chunks]


def drain(sched, model, max_steps=1000):
    for _ in range(max_steps):
        if not sched.has_work:
            return
        step(sched, model)
    raise AssertionError("scheduler did not drain")


def assert_idle_and_empty(sched):
    assert not sched.has_work
    sched.cache.evict(sched.pool.num_blocks)
    sched.check_integrity()
    assert sched.pool.num_free == sched.pool.num_blocks


def test_config_is_validated():
    with pytest.raises(ValueError, match="max_num_seqs=0"):
        SchedulerConfig(max_num_seqs=0)
    with pytest.raises(ValueError, match="chunk_size=9"):
        SchedulerConfig(max_num_batched_tokens=8, chunk_size=9)
    assert SchedulerConfig(max_num_batched_tokens=8).max_chunk_len == 8
    assert SchedulerConfig(max_num_batched_tokens=8, chunk_size=3).max_chunk_len == 3
    with pytest.raises(ValueError, match=r"chunk_size=9 is out of range: .*max_num_batched_tokens=8"):
        SchedulerConfig(max_num_batched_tokens=8, chunk_size=9)
    with pytest.raises(ValueError, match="max_num_seqs=True"):
        SchedulerConfig(max_num_seqs=True)
    with pytest.raises(ValueError, match="block_size=0"):
        CacheView(block_size=0, enable_prefix_cache=True)
    with pytest.raises(ValueError, match="enable_prefix_cache=1"):
        CacheView(block_size=4, enable_prefix_cache=1)


def test_cache_knobs_are_not_scheduler_knobs():
    """block_size and prefix caching belong to the cache config; the scheduler only views them."""
    for name in ("block_size", "enable_prefix_cache"):
        with pytest.raises(TypeError, match=name):
            SchedulerConfig(**{name: 4})
    with pytest.raises(TypeError):
        CacheView()  # no defaults: the owner's values must be handed over


def test_view_block_size_must_match_the_cache():
    pool = BlockPool(8)
    with pytest.raises(ValueError, match="cache block_size=4 differs from the view's block_size=8"):
        Scheduler(SchedulerConfig(), pool, RadixCache(pool, 4), CacheView(8, True))
    with pytest.raises(ValueError, match="needs a RadixCache"):
        Scheduler(SchedulerConfig(), pool, None, CacheView(4, True))


def test_add_rejects_what_can_never_fit():
    sched, _ = make(num_blocks=4)
    with pytest.raises(ValueError, match="needs 5 KV blocks, the pool has 4"):
        sched.add(seq(1, range(16), max_tokens=1))
    with pytest.raises(ValueError, match="empty prompt"):
        sched.add(seq(2, []))


def test_long_prompt_is_prefilled_in_chunks_across_steps():
    sched, model = make(max_num_batched_tokens=8)
    a = seq(1, range(100, 120), max_tokens=2)
    sched.add(a)
    assert step(sched, model) == [(1, 0, 8, False)]
    assert a.block_table == [0, 1] and a.num_computed == 8
    assert sched.cache.match(None, a.prompt_ids, record=False).cached_len == 8
    assert step(sched, model) == [(1, 8, 8, False)]
    assert step(sched, model) == [(1, 16, 4, True)]
    assert a.block_table == [0, 1, 2, 3, 4] and a.output_ids == expected_output(a.prompt_ids, 1)
    assert step(sched, model) == [(1, 20, 1, True)]
    assert a.status is SeqStatus.FINISHED and a.output_ids == expected_output(a.prompt_ids, 2)
    assert sched.cache.match(None, a.all_ids, record=False).cached_len == 21
    assert_idle_and_empty(sched)


def test_decodes_go_first_and_prefills_fill_the_budget():
    sched, model = make(max_num_batched_tokens=8)
    sched.add(seq(1, range(6), max_tokens=4))
    assert step(sched, model) == [(1, 0, 6, True)]
    sched.add(seq(2, range(50, 70), max_tokens=1))
    sched.add(seq(3, range(80, 84), max_tokens=1))
    assert step(sched, model) == [(1, 6, 1, True), (2, 0, 7, False)]
    assert step(sched, model) == [(1, 7, 1, True), (2, 7, 7, False)]
    assert step(sched, model) == [(1, 8, 1, True), (2, 14, 6, True), (3, 0, 1, False)]
    assert step(sched, model) == [(3, 1, 3, True)]
    assert_idle_and_empty(sched)


def test_second_request_hits_the_first_ones_prefix_and_copies_the_partial_block():
    sched, model = make()
    a = seq(1, range(10), max_tokens=1)
    sched.add(a)
    assert step(sched, model) == [(1, 0, 10, True)]
    assert a.status is SeqStatus.FINISHED
    b = seq(2, list(range(10)) + [50, 51], max_tokens=1)
    sched.add(b)
    out = sched.schedule()
    sched.check_integrity()
    # KV of a's 10 tokens: blocks 0, 1 full and shared, block 2 holds 8..9: copied into 3
    assert b.cached_len == 10 and b.num_computed == 10
    assert b.block_table == [0, 1, 3]
    assert out.copies == [(2, 3)]
    assert [(c.start, c.num_tokens, c.samples) for c in out.chunks] == [(10, 2, True)]
    assert [sched.pool.refcount(i) for i in range(4)] == [2, 2, 2, 1]  # 2 pinned for copy
    sched.on_tokens(model.run(out))
    sched.check_integrity()
    assert sched.pool.refcount(2) == 1
    assert (sched.cache.queried_tokens, sched.cache.hit_tokens) == (9 + 11, 10)
    sched.finish(b.seq_id, "length")
    assert b.output_ids == expected_output(b.prompt_ids, 1)
    assert_idle_and_empty(sched)


def test_aligned_hit_shares_blocks_without_a_copy():
    sched, model = make()
    sched.add(seq(1, range(9), max_tokens=1))
    drain(sched, model)
    b = seq(2, list(range(8)) + [40, 41], max_tokens=1)
    sched.add(b)
    out = sched.schedule()
    assert (b.cached_len, b.block_table, out.copies) == (8, [0, 1, 3], [])
    sched.on_tokens(model.run(out))
    sched.check_integrity()


def test_waiting_request_waits_for_an_in_flight_shared_prefix():
    sched, model = make(max_num_batched_tokens=16, chunk_size=8)
    shared = list(range(100, 124))
    sched.add(seq(1, shared + [1, 2, 3, 4], max_tokens=1))
    b = seq(2, shared + [9, 9], max_tokens=1)
    sched.add(b)
    assert step(sched, model) == [(1, 0, 8, False)]
    assert step(sched, model) == [(1, 8, 8, False)]
    assert step(sched, model) == [(1, 16, 8, False)]
    assert b.status is SeqStatus.WAITING
    out = sched.schedule()
    sched.check_integrity()
    assert [(c.seq.seq_id, c.start, c.num_tokens) for c in out.chunks] == [(1, 24, 4), (2, 24, 2)]
    assert b.cached_len == 24 and b.block_table == [0, 1, 2, 3, 4, 5, 7]  # a holds 0..6
    assert out.copies == []
    sched.on_tokens(model.run(out))
    sched.finish(SeqId(1), "length")
    sched.finish(SeqId(2), "length")
    assert b.output_ids == expected_output(b.prompt_ids, 1)
    assert sched.cache.hit_tokens == 24
    assert_idle_and_empty(sched)


def test_without_prefix_cache_both_compute():
    config = SchedulerConfig(max_num_batched_tokens=16, chunk_size=8)
    pool = BlockPool(64)
    view = CacheView(block_size=4, enable_prefix_cache=False)
    sched, model = Scheduler(config, pool, None, view), FakeModel(4)
    shared = list(range(100, 124))
    sched.add(seq(1, shared + [1], max_tokens=1))
    sched.add(seq(2, shared + [2], max_tokens=1))
    assert step(sched, model) == [(1, 0, 8, False), (2, 0, 8, False)]
    drain(sched, model)
    assert pool.num_free == 64


def test_preemption_under_a_tiny_pool_resumes_until_all_finish():
    prompts = [list(range(i * 10, i * 10 + 6)) for i in range(4)]
    sched, model = make(num_blocks=8, max_num_batched_tokens=32)
    seqs = [seq(i + 1, p, max_tokens=10) for i, p in enumerate(prompts)]
    for s in seqs:
        sched.add(s)
    drain(sched, model)
    assert sched.preemptions > 0
    assert [s.output_ids for s in seqs] == [expected_output(p, 10) for p in prompts]
    assert all(s.status is SeqStatus.FINISHED for s in seqs)
    assert sched.cache.evicted_blocks > 0
    assert_idle_and_empty(sched)


def test_youngest_is_preempted_and_goes_back_to_the_front():
    sched, model = make(num_blocks=6, max_num_batched_tokens=32)
    a, b = seq(1, range(8), max_tokens=8), seq(2, range(50, 58), max_tokens=8)
    sched.add(a)
    sched.add(b)
    assert step(sched, model) == [(1, 0, 8, True), (2, 0, 8, True)]
    # each takes its third block for positions 8..11; position 12 of `a` needs a 7th
    assert step(sched, model) == [(1, 8, 1, True), (2, 8, 1, True)]
    assert step(sched, model) == [(1, 9, 1, True), (2, 9, 1, True)]
    assert step(sched, model) == [(1, 10, 1, True), (2, 10, 1, True)]
    assert step(sched, model) == [(1, 11, 1, True), (2, 11, 1, True)]
    out = sched.schedule()
    sched.check_integrity()
    assert out.preempted == [2] and sched.preemptions == 1
    assert [c.seq.seq_id for c in out.chunks] == [1]
    assert b.status is SeqStatus.WAITING and list(sched.waiting) == [b]
    assert (b.block_table, b.num_computed, b.num_preemptions) == ([], 0, 1)
    sched.on_tokens(model.run(out))
    drain(sched, model)
    assert a.output_ids == expected_output(a.prompt_ids, 8)
    assert b.output_ids == expected_output(b.prompt_ids, 8)
    assert_idle_and_empty(sched)


def test_abort_frees_waiting_and_running_sequences_at_once():
    sched, model = make(max_num_batched_tokens=8)
    a, b = seq(1, range(20), max_tokens=4), seq(2, range(30, 34), max_tokens=4)
    sched.add(a)
    sched.add(b)
    out = sched.schedule()
    assert b.status is SeqStatus.WAITING
    assert sched.abort(b.seq_id) is b and b.status is SeqStatus.ABORTED
    sched.abort(a.seq_id)
    sched.check_integrity()
    sched.on_tokens(model.run(out))  # the step that ran for `a` is ignored
    sched.check_integrity()
    assert a.status is SeqStatus.ABORTED and a.block_table == [] and a.num_computed == 0
    assert (sched.num_running, sched.num_waiting, sched.pool.num_free) == (0, 0, 64)
    with pytest.raises(KeyError):
        sched.abort(a.seq_id)


def test_namespaces_do_not_share_prefixes():
    sched, model = make()
    sched.add(seq(1, range(12), max_tokens=1, ns="a"))
    drain(sched, model)
    b = seq(2, range(12), max_tokens=1, ns="b")
    sched.add(b)
    drain(sched, model)
    assert b.cached_len == 0
    c = seq(3, range(12), max_tokens=1, ns="a")
    sched.add(c)
    drain(sched, model)
    assert c.cached_len == 11
    assert_idle_and_empty(sched)


def test_a_lone_sequence_never_livelocks_on_blocks_its_own_lock_pins():
    # b matches 3 of a's 4 cached tokens (bs 3): the node it locks keeps a's block for
    # position 3, which b has its own copy of. With a 3-block pool b cannot grow while it
    # holds the lock; it must drop it, not preempt itself forever.
    sched, model = make(num_blocks=3, block_size=3, max_num_batched_tokens=1, max_num_seqs=1)
    a, b = seq(1, range(4), max_tokens=1), seq(2, range(4), max_tokens=4)
    sched.add(a)
    sched.add(b)
    drain(sched, model, max_steps=100)
    assert b.cached_len == 3 and b.output_ids == expected_output(b.prompt_ids, 4)
    assert sched.preemptions == 0
    assert_idle_and_empty(sched)


def test_admission_with_nothing_running_starts_cold_when_the_locked_hit_cannot_fit():
    # a's 29 cached tokens sit in one node of 10 blocks: the whole pool. b hits 4 of them,
    # but locking that node pins all 10 blocks while b's first chunk needs 7 more.
    sched, model = make(num_blocks=10, block_size=3, max_num_batched_tokens=32)
    sched.add(seq(1, range(29), max_tokens=1))
    drain(sched, model)
    assert sched.pool.num_free == 0
    b = seq(2, list(range(4)) + list(range(100, 120)), max_tokens=1)
    sched.add(b)
    assert step(sched, model) == [(2, 0, 24, True)]
    assert b.cached_len == 0 and b.output_ids == expected_output(b.prompt_ids, 1)
    assert_idle_and_empty(sched)

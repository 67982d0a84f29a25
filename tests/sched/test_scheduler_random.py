"""Scheduler under random workloads: integrity after every mutation, outputs equal to the
sequential reference whatever the batching, chunking, hits and preemptions, and no leak."""

from hypothesis import given, settings
from hypothesis import strategies as st
from test_scheduler import FakeModel, expected_output

from agentkv.cache import BlockPool, RadixCache
from agentkv.sched import CacheView, Scheduler, SchedulerConfig, SeqId, SeqStatus, Sequence

BASES = (list(range(20)), [5] * 20, list(range(40, 20, -1)))

request_st = st.tuples(
    st.integers(0, 2),
    st.integers(4, 16),
    st.lists(st.integers(0, 3), max_size=5),
    st.integers(1, 6),
    st.integers(0, 1),
    st.integers(0, 3),  # max_tokens, ns, arrival step
    st.one_of(st.none(), st.none(), st.integers(0, 10)),
)  # abort at step


@settings(max_examples=100, deadline=None)
@given(
    requests=st.lists(request_st, min_size=2, max_size=6),
    block_size=st.integers(1, 4),
    budget=st.integers(1, 12),
    chunk=st.integers(1, 12),
    num_blocks=st.integers(0, 6),
    max_num_seqs=st.integers(1, 4),
    enable_cache=st.booleans(),
)
def test_random_workloads_finish_with_reference_outputs(
    requests, block_size, budget, chunk, num_blocks, max_num_seqs, enable_cache
):
    seqs = [
        Sequence(SeqId(i), (BASES[b][:cut] + tail) or [1], max_tokens, namespace=ns)
        for i, (b, cut, tail, max_tokens, ns, _, _) in enumerate(requests)
    ]
    need = max(-(-(len(s.prompt_ids) + s.max_tokens) // block_size) for s in seqs)
    config = SchedulerConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=budget, chunk_size=min(chunk, budget))
    view = CacheView(block_size=block_size, enable_prefix_cache=enable_cache)
    pool = BlockPool(need + num_blocks)
    cache = RadixCache(pool, block_size)
    sched, model = Scheduler(config, pool, cache, view), FakeModel(block_size)
    aborted = set()
    for step in range(1000):
        for s, req in zip(seqs, requests):
            if req[5] == step:
                sched.add(s)
            if req[6] == step and s.status in (SeqStatus.WAITING, SeqStatus.RUNNING) and s.arrival >= 0:
                sched.abort(s.seq_id)
                aborted.add(s.seq_id)
        sched.check_integrity()
        if not sched.has_work and step > 6:
            break
        out = sched.schedule()
        sched.check_integrity()
        assert out.num_batched_tokens <= budget and len(sched.running) <= max_num_seqs
        sched.on_tokens(model.run(out))
        sched.check_integrity()
        for s in list(sched.running):
            if len(s.output_ids) >= s.max_tokens:
                sched.finish(s.seq_id, "length")
                sched.check_integrity()
    else:
        raise AssertionError("scheduler did not drain")
    for s in seqs:
        if s.seq_id not in aborted:
            assert s.status is SeqStatus.FINISHED
            assert s.output_ids == expected_output(s.prompt_ids, s.max_tokens)
    cache.evict(pool.num_blocks)
    sched.check_integrity()
    assert pool.num_free == pool.num_blocks

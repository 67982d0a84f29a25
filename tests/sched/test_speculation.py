"""Scheduler side of speculative decoding: verification chunks, rollback of rejected KV,
exact block tables and pool integrity, and a radix tree that only ever sees accepted tokens.

The fake model writes, for position p, the payload context[:p+1] into its block (the draft
included) and first reads every earlier position back through the block table, as in
tests/sched/test_scheduler.py: KV left behind by a rejected draft token, or a length not
reset after a rejection, shows up as a wrong read."""

import random

from agentkv.cache.radix_check import block_refs
from agentkv.sched import SeqStatus
from tests.sched.test_scheduler import expected_output, make, next_token, seq


def run_verified(model, out):
    """Run one step; a verification chunk returns the accepted draft prefix plus one."""
    sampled = {}
    for chunk in out.chunks:
        s = chunk.seq
        context, table, bs = s.all_ids[: chunk.start] + chunk.token_ids, s.block_table, model.bs
        for p in range(chunk.start):
            assert model.kv[table[p // bs]].get(p % bs) == tuple(s.all_ids[: p + 1]), f"stale KV at {p}"
        for p in range(chunk.start, chunk.start + chunk.num_tokens):
            model.kv[table[p // bs]][p % bs] = tuple(context[: p + 1])
        if not chunk.samples:
            continue
        if not chunk.draft:
            sampled[s.seq_id] = next_token(s.all_ids)
            continue
        ids, tokens = list(s.all_ids), []
        for d in (*chunk.draft, None):
            tokens.append(next_token(ids))
            if d != tokens[-1]:
                break
            ids.append(d)
        sampled[s.seq_id] = tokens
    return sampled


def drive(sched, model, seqs, rnd):
    """Step to completion, drafting a random mix of right and wrong tokens each step;
    returns (drafted, accepted) token counts."""
    num_drafted = num_accepted = 0
    for s in seqs:
        sched.add(s)
    while sched.has_work:
        for s in sched.running:
            if s.is_decoding:
                truth = expected_output(s.all_ids, 6)
                num_right = rnd.randrange(0, 7)
                s.draft_ids = truth[:num_right] + [rnd.randrange(97) for _ in range(rnd.randrange(0, 3))]
        out = sched.schedule()
        sampled = run_verified(model, out)
        for c in out.chunks:
            if c.draft and c.seq.seq_id in sampled:
                num_drafted += len(c.draft)
                num_accepted += len(sampled[c.seq.seq_id]) - 1
        sched.on_tokens(sampled)
        sched.check_integrity()
        for s in list(sched.running):
            if s.output_ids and rnd.random() < 0.05:  # a stop inside the accepted tokens
                sched.trim_output(s.seq_id, rnd.randrange(1, len(s.output_ids) + 1))
                sched.finish(s.seq_id, "stop")
            elif len(s.output_ids) == s.max_tokens:
                sched.finish(s.seq_id, "length")
            sched.check_integrity()
    return num_drafted, num_accepted


def test_random_drafts_give_plain_outputs_and_keep_the_pool_exact():
    rnd = random.Random(5)
    sched, model = make(num_blocks=40, max_num_batched_tokens=24)
    prompts = [[rnd.randrange(97) for _ in range(rnd.randrange(3, 20))] for _ in range(6)]
    seqs = [seq(i, p, max_tokens=rnd.randrange(4, 30)) for i, p in enumerate(prompts)]
    num_drafted, num_accepted = drive(sched, model, seqs, rnd)
    assert 0 < num_accepted < num_drafted  # both acceptance and rollback were exercised
    for s in seqs:
        assert s.status is SeqStatus.FINISHED
        assert s.output_ids == expected_output(s.prompt_ids, len(s.output_ids))
    assert sched.pool.num_used == sum(1 for _ in block_refs(sched.cache))


def test_rollback_frees_wholly_rejected_blocks_and_resets_the_length():
    sched, model = make(num_blocks=16, block_size=4)
    s = seq(0, [1, 2, 3], max_tokens=20)
    sched.add(s)
    sched.on_tokens(run_verified(model, sched.schedule()))  # prefill: 3 tokens, one sampled
    assert (s.num_computed, s.block_table) == (3, [0])
    right = expected_output(s.all_ids, 2)
    s.draft_ids = [right[0], (right[1] + 1) % 97, 5, 6, 7, 8]  # one right, then wrong
    out = sched.schedule()
    assert [(c.start, c.num_tokens, c.draft) for c in out.chunks] == [
        (3, 7, (right[0], (right[1] + 1) % 97, 5, 6, 7, 8))
    ]
    assert s.block_table == [0, 1, 2]  # positions 3..9 need blocks 0-2
    sched.on_tokens(run_verified(model, out))
    # kept: d0 and the pick after it; KV valid for positions 0..4, so blocks [0, 1] stay
    assert s.output_ids[1:] == right and s.num_computed == 5 and s.block_table == [0, 1]
    assert sched.pool.refcount(2) == 0
    sched.check_integrity()


def test_a_draft_is_cut_to_budget_and_max_tokens_and_dropped_rather_than_preempt():
    sched, model = make(num_blocks=16, block_size=4, max_num_batched_tokens=4)
    s = seq(0, [1, 2, 3], max_tokens=10)
    sched.add(s)
    sched.on_tokens(run_verified(model, sched.schedule()))
    s.draft_ids = [9] * 10
    assert [c.draft for c in sched.schedule().chunks] == [(9, 9, 9)]  # budget 4 = 1 + 3
    sched, model = make(num_blocks=16, block_size=4)
    s = seq(0, [1, 2, 3], max_tokens=3)
    sched.add(s)
    sched.on_tokens(run_verified(model, sched.schedule()))
    s.draft_ids = [9] * 10
    assert [c.draft for c in sched.schedule().chunks] == [(9,)]  # 1 out, 3 max: 1 + 1 more
    sched, model = make(num_blocks=2, block_size=4)
    a, b = seq(0, [1, 2, 3], max_tokens=5), seq(1, [4, 5, 6], max_tokens=1)
    sched.add(a)
    sched.add(b)
    sched.on_tokens(run_verified(model, sched.schedule()))
    assert (a.block_table, b.block_table, sched.pool.num_free) == ([0], [1], 0)
    a.draft_ids = [7, 8, 9]  # would need a third block: none is free
    out = sched.schedule()
    assert [(c.seq.seq_id, c.num_tokens, c.draft) for c in out.chunks] == [(0, 1, ()), (1, 1, ())]
    assert sched.preemptions == 0 and a.draft_ids == []
    sched.on_tokens(run_verified(model, out))
    sched.check_integrity()


def test_the_tree_never_sees_rejected_tokens():
    sched, model = make(num_blocks=16, block_size=4)
    s = seq(0, [1, 2, 3, 4, 5], max_tokens=3)
    sched.add(s)
    sched.on_tokens(run_verified(model, sched.schedule()))
    wrong = (expected_output(s.all_ids, 1)[0] + 1) % 97
    s.draft_ids = [wrong, 40, 41]
    sched.on_tokens(run_verified(model, sched.schedule()))
    assert s.output_ids[1] != wrong and len(s.output_ids) == 2  # rejected at once
    sched.finish(s.seq_id, "stop")
    sched.check_integrity()
    # the cache holds the prompt and the first output (KV of all_ids[:-1]), nothing drafted
    full = [1, 2, 3, 4, 5, *s.output_ids[:2]]
    assert sched.cache.match(None, full + [wrong, 40, 41], record=False).cached_len == len(full) - 1

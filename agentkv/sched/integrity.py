"""The scheduler's integrity check: pool, tree and every block's holders, recounted (tests
call it after every mutation)."""

from __future__ import annotations

from collections import Counter
from typing import Any

from agentkv.cache import BlockId
from agentkv.cache.radix_check import block_refs
from agentkv.sched.sequence import SeqStatus


def check_scheduler(sched: Any) -> None:  # a Scheduler (duck-typed: no import cycle)
    """Pool and tree are consistent, and every block's refcount is exactly the tree's
    references plus the running sequences' tables plus pinned copy sources."""
    sched.pool.check_integrity()
    refs: Counter[BlockId] = Counter(sched._pinned)
    if sched.cache is not None:
        sched.cache.check_integrity()
        refs.update(block_refs(sched.cache))
    for seq in sched.running:
        if seq.status is not SeqStatus.RUNNING:
            raise RuntimeError(f"seq {seq.seq_id} in running is {seq.status}: bug")
        if len(seq.block_table) < sched._num_blocks(seq.num_computed):
            raise RuntimeError(f"seq {seq.seq_id} has too few blocks: bug")
        refs.update(seq.block_table)
    for seq in sched.waiting:
        if seq.status is not SeqStatus.WAITING or seq.block_table or seq.num_computed:
            raise RuntimeError(f"waiting seq {seq.seq_id} holds state: bug")
    for block in range(sched.pool.num_blocks):
        if sched.pool.refcount(BlockId(block)) != refs[BlockId(block)]:
            raise RuntimeError(
                f"block {block}: refcount {sched.pool.refcount(block)}, {refs[BlockId(block)]} holders: bug"
            )

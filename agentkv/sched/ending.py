"""How a sequence leaves the scheduler (finished or aborted) and the integrity check of what it
leaves behind: pool, tree and every block's holders."""

from __future__ import annotations

from collections import Counter

from agentkv.cache import BlockId
from agentkv.sched.sequence import SeqId, SeqStatus, Sequence


class SequenceEnding:
    """Mixed into `Scheduler`, whose state (pool, cache, running, waiting, locks) it reads."""

    def finish(self, seq_id: SeqId, reason: str) -> Sequence:
        """End a sequence normally: its computed tokens go to the cache, its blocks and
        lock are released. Returns the finished sequence."""
        return self._end(seq_id, SeqStatus.FINISHED, reason, insert=True)

    def abort(self, seq_id: SeqId) -> Sequence:
        """End a sequence at once, waiting or running, without caching its tokens."""
        return self._end(seq_id, SeqStatus.ABORTED, "abort", insert=False)

    def _end(self, seq_id: SeqId, status: SeqStatus, reason: str, insert: bool) -> Sequence:
        seq = self._seqs.pop(seq_id, None)
        if seq is None:
            raise KeyError(f"seq {seq_id} is not scheduled")
        if seq.status is SeqStatus.RUNNING:
            self._release(seq, insert)
            self.running.remove(seq)
        else:
            self.waiting.remove(seq)
        seq.status = status
        seq.finish_reason = reason
        return seq

    def check_integrity(self) -> None:
        """Pool and tree are consistent, and every block's refcount is exactly the tree's
        references plus the running sequences' tables plus pinned copy sources."""
        self.pool.check_integrity()
        refs: Counter[BlockId] = Counter(self._pinned)
        if self.cache is not None:
            self.cache.check_integrity()
            refs.update(self.cache.block_refs())
        for seq in self.running:
            if seq.status is not SeqStatus.RUNNING:
                raise RuntimeError(f"seq {seq.seq_id} in running is {seq.status}: bug")
            if len(seq.block_table) < self._num_blocks(seq.num_computed):
                raise RuntimeError(f"seq {seq.seq_id} has too few blocks: bug")
            refs.update(seq.block_table)
        for seq in self.waiting:
            if seq.status is not SeqStatus.WAITING or seq.block_table or seq.num_computed:
                raise RuntimeError(f"waiting seq {seq.seq_id} holds state: bug")
        for block in range(self.pool.num_blocks):
            if self.pool.refcount(BlockId(block)) != refs[BlockId(block)]:
                raise RuntimeError(
                    f"block {block}: refcount {self.pool.refcount(block)}, {refs[BlockId(block)]} holders: bug"
                )

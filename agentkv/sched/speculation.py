"""Speculative decoding in the scheduler: a decode row grows into a verification chunk of
1 + k rows, and after it ran the rejected positions are rolled back."""

from __future__ import annotations

from agentkv.cache import BlockPool
from agentkv.sched.plan import ScheduledChunk
from agentkv.sched.sequence import SeqStatus, Sequence


class DraftBlocks:
    """The blocks of speculation: taken for a draft from the free list only, and given back
    for the positions a verification rejected. The scheduler holds one; it shares the pool."""

    def __init__(self, pool: BlockPool, block_size: int) -> None:
        self.pool, self.block_size = pool, block_size

    def _num_blocks(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def take_draft(self, seq: Sequence, budget_left: int) -> tuple[int, ...]:
        """Blocks for `seq`'s decode row plus as much of its draft as the step's budget and
        max_tokens allow, from the free list only: speculation never evicts the cache nor
        preempts anyone. Returns the draft to verify; empty (nothing taken) when none fits."""
        room = min(budget_left - 1, seq.max_tokens - len(seq.output_ids) - 1)
        draft = tuple(seq.draft_ids[: max(0, room)])
        if not draft:
            return ()
        needed = self._num_blocks(seq.num_computed + 1 + len(draft)) - len(seq.block_table)
        blocks = self.pool.allocate(max(0, needed))
        if blocks is None:
            return ()
        seq.block_table.extend(blocks)
        return draft

    def on_verified(self, chunk: ScheduledChunk, tokens: list[int]) -> None:
        """A verification ran: `tokens` are the accepted draft prefix plus the sampler's
        pick after it. KV stays valid up to the last accepted draft token; the rejected
        positions are rolled back (length reset, blocks holding only them freed)."""
        seq = chunk.seq
        num_accepted = len(tokens) - 1
        if not 0 <= num_accepted <= len(chunk.draft) or tuple(tokens[:-1]) != chunk.draft[:num_accepted]:
            raise RuntimeError(
                f"seq {seq.seq_id}: {tokens} is not an accepted prefix of the draft {chunk.draft} plus one token: bug"
            )
        seq.num_computed += 1 + num_accepted
        seq.output_ids.extend(tokens)
        self.free_blocks_past(seq)

    def free_blocks_past(self, seq: Sequence) -> None:
        """Free the blocks of `seq`'s table past its computed KV (written by rejected draft
        tokens only; the tree never saw them)."""
        keep = self._num_blocks(seq.num_computed)
        self.pool.free(seq.block_table[keep:])
        del seq.block_table[keep:]

    def trim_output(self, seq: Sequence, num_output: int) -> None:
        """Keep the first `num_output` output tokens of a running sequence (mutates): a stop
        landed inside accepted draft tokens, so the rest never happened. KV is cut to what
        plain decode would hold at that point, so `finish` caches exactly the same tokens."""
        if seq.status is not SeqStatus.RUNNING or not 0 < num_output <= len(seq.output_ids):
            raise RuntimeError(f"trim_output({seq.seq_id}, {num_output}) on {seq.status}: bug")
        del seq.output_ids[num_output:]
        seq.num_computed = min(seq.num_computed, seq.num_tokens - 1)
        self.free_blocks_past(seq)

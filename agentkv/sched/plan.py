"""What one scheduling step plans: the chunks to compute, the block copies and disk loads
to apply first, and who was preempted. Plain data, shared by the scheduler and its
collaborators."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from agentkv.cache import BlockId
from agentkv.sched.sequence import SeqId, Sequence


class ScheduledChunk(NamedTuple):
    """Compute KV for seq.all_ids[start:start + num_tokens] at positions start.. into
    seq.block_table; when `samples`, the last row's logits sample the next token.

    A verification chunk (non-empty `draft`) is a decode row followed by the draft:

        tokens:     | all_ids[start] | draft[0] ... draft[k-1] |   num_tokens = 1 + k
        logits:     every row; row i samples the token after draft[:i]
    """

    seq: Sequence
    start: int
    num_tokens: int
    samples: bool
    draft: tuple[int, ...] = ()

    @property
    def token_ids(self) -> list[int]:
        """The tokens this chunk computes (the draft included)."""
        if self.draft:
            return [*self.seq.ids(self.start, self.start + 1), *self.draft]
        return self.seq.ids(self.start, self.start + self.num_tokens)


class SchedulerOutput(NamedTuple):
    chunks: list[ScheduledChunk]
    copies: list[tuple[BlockId, BlockId]]  # run backend.copy_blocks(kv, copies) first
    preempted: list[SeqId]  # lost their blocks this step; they will recompute
    loads: list[tuple[BlockId, bytes]] = []  # disk-tier payloads: backend.write_block first

    @property
    def num_batched_tokens(self) -> int:
        return sum(chunk.num_tokens for chunk in self.chunks)


@dataclass(slots=True)
class _Step:
    budget: int
    chunks: dict[SeqId, ScheduledChunk] = field(default_factory=dict)
    copies: list[tuple[BlockId, BlockId]] = field(default_factory=list)
    preempted: list[SeqId] = field(default_factory=list)
    loads: list[tuple[BlockId, bytes]] = field(default_factory=list)

    @property
    def budget_left(self) -> int:
        return self.budget - sum(chunk.num_tokens for chunk in self.chunks.values())

    def add(self, seq: Sequence, num_tokens: int) -> None:
        samples = seq.num_computed + num_tokens == seq.num_tokens
        self.chunks[seq.seq_id] = ScheduledChunk(seq, seq.num_computed, num_tokens, samples)

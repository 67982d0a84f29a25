"""A request as the scheduler sees it: its tokens, its KV blocks, how far its KV goes."""

from __future__ import annotations

import enum
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import NewType

from agentkv.cache import BlockId

SeqId = NewType("SeqId", int)


class SeqStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"
    ABORTED = "aborted"


@dataclass(slots=True)
class Sequence:
    """Mutable per-request state, owned by the scheduler once added.

    KV exists for all_ids[:num_computed]. To sample the next token the sequence needs KV for
    all_ids[:-1] and computes the last one, so the work left is all_ids[num_computed:]:

        all_ids:   | prompt_ids ............... | output_ids ... |
                   |<- num_computed ->|<-- num_remaining ------->|
        prefill:   num_remaining > 1 (or no output yet): chunks of the rest
        decode:    num_remaining == 1: the last sampled token
    """

    seq_id: SeqId
    prompt_ids: list[int]
    max_tokens: int
    namespace: Hashable = None
    output_ids: list[int] = field(default_factory=list)
    block_table: list[BlockId] = field(default_factory=list)
    num_computed: int = 0
    cached_len: int = 0  # tokens served from the cache at the first admission
    status: SeqStatus = SeqStatus.WAITING
    arrival: int = -1  # FCFS order, set by Scheduler.add
    num_preemptions: int = 0
    finish_reason: str | None = None
    # Speculation: tokens the engine drafted to follow all_ids, verified by the next step
    # (set before `Scheduler.schedule`, which consumes them); never part of all_ids.
    draft_ids: list[int] = field(default_factory=list)

    @property
    def all_ids(self) -> list[int]:
        return self.prompt_ids + self.output_ids

    def ids(self, start: int, end: int) -> list[int]:
        """all_ids[start:end] (0 <= start <= end) without building all_ids: a decode step
        reads one token of a long context, and a whole-context copy per step would cost
        O(context) each time."""
        num_prompt = len(self.prompt_ids)
        if end <= num_prompt:
            return self.prompt_ids[start:end]
        if start >= num_prompt:
            return self.output_ids[start - num_prompt : end - num_prompt]
        return self.prompt_ids[start:] + self.output_ids[: end - num_prompt]

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def num_remaining(self) -> int:
        return self.num_tokens - self.num_computed

    @property
    def is_decoding(self) -> bool:
        return self.num_remaining == 1 and bool(self.output_ids)

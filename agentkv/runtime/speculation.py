"""Speculative decoding in the engine: draft before the schedule, verify after the step.

A drafting request's decode row becomes a chunk of 1 + k rows through the normal chunked
path; every row's logits come back. The rows are sampled in order exactly as plain decode
would sample them one step at a time (row i sees the first i draft tokens as output), and
the kept tokens are the longest draft prefix equal to the sampler's picks plus the pick at
the first mismatch:

    draft:    d0  d1  d2  d3
    picks:    d0  d1  x           -> tokens d0 d1 x ; rows past the mismatch are never sampled

The kernels give a row the same bits at any chunk size (docs/design.md, the exactness
contract) and seeded draws are keyed by position (runtime/sampler.py), so the tokens and
logprobs are those of plain decode, bit for bit."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from agentkv.runtime.sampler import SampleResult, sample
from agentkv.sched import ScheduledChunk, SeqStatus
from agentkv.sched.draft import Drafter, DraftLength

if TYPE_CHECKING:
    from agentkv.runtime.engine import _Request
    from agentkv.runtime.outputs import RequestOutput


class SpeculativeEngine:
    """The engine's speculation methods, kept apart from the plain step. Uses the host's
    `drafter`, `_requests`, `scheduler`, `counters`, `record_logits` and `recorded`."""

    drafter: Drafter | None

    def _draft_length(self, params, constraint) -> DraftLength | None:
        """The request's adaptive draft length, or None when it never drafts: speculation
        off, the request opted out, or structured output (its mask follows each token)."""
        if self.drafter is None or not params.speculative or constraint is not None:
            return None
        return DraftLength(self.config.num_speculative_tokens)

    def _propose_drafts(self) -> None:
        """Give every decoding request that drafts its draft for this step (mutates seqs)."""
        for req in self._requests.values():
            seq = req.seq
            if req.draft is None or seq.status is not SeqStatus.RUNNING or not seq.is_decoding:
                continue
            k = min(req.draft.next(), seq.max_tokens - len(seq.output_ids) - 1)
            seq.draft_ids = self.drafter.propose(seq.seq_id, seq.all_ids, k) if k > 0 else []

    def _verify(self, req: _Request, sc: ScheduledChunk, rows: np.ndarray) -> list[SampleResult]:
        """Sample the rows `[1 + k, vocab]` of a verification chunk in order; returns the
        accepted draft tokens' samples and the one after them. Leaves `req.sampling` as it
        was (the caller appends what it keeps); learns the draft length."""
        state = req.sampling
        num_before = len(state.output_ids)
        results: list[SampleResult] = []
        try:
            for i, row in enumerate(rows):
                if self.record_logits:
                    self.recorded.setdefault(req.request_id, []).append(row.copy())
                result = sample(row, req.params, state, None)
                results.append(result)
                if i == len(sc.draft) or result.token_id != sc.draft[i]:
                    break
                state.output_ids.append(result.token_id)  # row i + 1 sees it as output
        finally:
            del state.output_ids[num_before:]
        num_accepted = len(results) - 1
        req.draft.update(len(sc.draft), num_accepted)
        self.counters.spec_drafted_tokens += len(sc.draft)
        self.counters.spec_accepted_tokens += num_accepted
        self.counters.spec_verify_steps += 1
        return results

    def _advance_verified(self, req: _Request, results: list[SampleResult]) -> RequestOutput:
        """Take the verified tokens one by one as plain decode would; a stop among them
        drops the rest (their KV is rolled back) before the request finishes."""
        for j, result in enumerate(results):
            if not self._take(req, result):
                continue
            num_dropped = len(results) - j - 1
            if num_dropped:
                self.scheduler.trim_output(req.seq.seq_id, len(req.sampling.output_ids))
                if self.record_logits:
                    del self.recorded[req.request_id][-num_dropped:]
            self.scheduler.finish(req.seq.seq_id, req.finish_reason)
            return self._emit(req, True)
        return self._emit(req, False)

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
logprobs are those of plain decode, bit for bit.

Drafts come only from the request's own namespace (its tenant, salt): a drafter's history is
kept per namespace, so the acceptance a request sees, and its timing, never depend on another
tenant's prompts. A drafter that raises is switched off with a logged error: drafts only ever
cost time, so the engine goes on without them.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable

import numpy as np

from agentkv.runtime.outputs import Counters
from agentkv.runtime.request import Request
from agentkv.runtime.sampler import SampleResult, sample
from agentkv.sched import ScheduledChunk, SeqStatus
from agentkv.sched.draft import Drafter, DraftLength, make_drafter

log = logging.getLogger(__name__)
MAX_NAMESPACES = 256  # drafters kept at once, one per namespace (each bounds its own history)


class Speculation:
    """The engine's drafter per namespace and the verification of its drafts."""

    def __init__(self, drafter_name: str, limit: int, counters: Counters) -> None:
        self.drafter_name, self.limit, self.counters = drafter_name, limit, counters
        self._drafters: OrderedDict[Hashable, Drafter] = OrderedDict()  # namespace -> its own, LRU
        self.enabled = True
        self.record: Callable[[str, np.ndarray], None] | None = None  # tests: every sampled row

    def draft_length(self, params, constraint) -> DraftLength | None:
        """The request's adaptive draft length, or None when it never drafts: speculation
        off, the request opted out, or structured output (its mask follows each token)."""
        if not self.enabled or not params.speculative or constraint is not None:
            return None
        return DraftLength(self.limit)

    def _drafter(self, namespace: Hashable):
        drafter = self._drafters.get(namespace)
        if drafter is None:
            drafter = self._drafters[namespace] = make_drafter(self.drafter_name)
            if len(self._drafters) > MAX_NAMESPACES:  # the oldest tenant's history goes
                self._drafters.popitem(last=False)
        self._drafters.move_to_end(namespace)
        return drafter

    def propose(self, requests: Iterable[Request]) -> None:
        """Give every decoding request that drafts its draft for this step (mutates seqs)."""
        if not self.enabled:
            return
        try:
            for req in requests:
                seq = req.seq
                if req.draft is None or seq.status is not SeqStatus.RUNNING or not seq.is_decoding:
                    continue
                k = min(req.draft.next(), seq.max_tokens - len(seq.output_ids) - 1)
                seq.draft_ids = self._drafter(seq.namespace).propose(seq.seq_id, seq.all_ids, k) if k > 0 else []
        except Exception as exc:  # noqa: BLE001 — drafts are an optimisation: go on without them
            self._disable(exc, requests)

    def _disable(self, exc: Exception, requests: Iterable[Request]) -> None:
        log.error("speculative decoding switched off: the %s drafter failed: %r", self.drafter_name, exc)
        self.enabled = False
        for req in requests:
            req.seq.draft_ids, req.draft = [], None

    def end(self, req: Request) -> None:
        """The request finished or was aborted: its drafter forgets it (and may learn)."""
        if not self.enabled:
            return
        drafter = self._drafters.get(req.seq.namespace)
        try:
            if drafter is not None:
                drafter.end(req.seq.seq_id, req.seq.all_ids)
        except Exception as exc:  # noqa: BLE001
            self._disable(exc, [])

    def verify(self, req: Request, sc: ScheduledChunk, rows: np.ndarray) -> list[SampleResult]:
        """Sample the rows `[1 + k, vocab]` of a verification chunk in order; returns the
        accepted draft tokens' samples and the one after them. Leaves `req.sampling` as it
        was (the caller appends what it keeps); learns the draft length."""
        state = req.sampling
        num_before = len(state.output_ids)
        results: list[SampleResult] = []
        try:
            for i, row in enumerate(rows):
                if self.record is not None:
                    self.record(req.request_id, row)
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

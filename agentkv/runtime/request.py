"""One request inside the engine: its sequence, how it samples and stops, and what of its
output its reader has not been sent yet.

Text moves through three states; only the unsent part is kept, so a step's cost and a
request's memory never grow with the text already streamed:

    | sent (counted, not kept) | unsent: the stop holdback, or a whole step's text |
    ^ 0                        ^ sent_chars                                       ^ stop.num_chars
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from agentkv.formats.tokenizer import IncrementalDecoder
from agentkv.runtime.outputs import Counters, RequestOutput, TokenLogprob
from agentkv.runtime.params import SamplingParams
from agentkv.runtime.sampler import SampleResult, SamplingState
from agentkv.runtime.stop import StopChecker
from agentkv.sched import Sequence
from agentkv.sched.draft import DraftLength


@dataclass(slots=True)
class Request:
    """Mutable; owned by the engine thread."""

    request_id: str
    seq: Sequence
    params: SamplingParams
    sampling: SamplingState
    stop: StopChecker
    detok: IncrementalDecoder
    constraint: Any = None
    unsent: str = ""  # output text not emitted yet
    sent_chars: int = 0
    sent_tokens: int = 0
    logprobs: list[TokenLogprob] = field(default_factory=list)  # not emitted yet
    prompt_logprobs: list[TokenLogprob | None] | None = None
    first_sent: bool = False
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    arrival: float = field(default_factory=time.perf_counter)
    draft: DraftLength | None = None  # None: this request never drafts

    def take(self, result: SampleResult, counters: Counters) -> bool:
        """Append one sampled token: logprobs, grammar, text, stop checks (mutates the
        request, not the scheduler). Returns whether the request finished."""
        tok = result.token_id
        self.sampling.append(tok)
        counters.generation_tokens += 1
        if self.params.logprobs is not None:
            self.logprobs.append(TokenLogprob(tok, result.logprob, result.top_logprobs, result.token_logits))
        if self.constraint is not None:
            self.constraint.accept(tok)
        new_text = self.detok.push(tok)
        decision = self.stop.check(tok, new_text)
        if decision.finished and isinstance(decision.matched, int):
            # A stop token's text is not part of the answer (a stop id's only when asked).
            if not (self.params.include_stop_str_in_output and tok in self.params.stop_token_ids):
                new_text = ""
        self.unsent += new_text
        if decision.trim_text_to is not None:  # the holdback kept the cut inside the unsent text
            self.unsent = self.unsent[: decision.trim_text_to - self.sent_chars]
        finished = decision.finished
        if not finished and self.constraint is not None and self.constraint.is_finished():
            finished, self.finish_reason = True, "stop"
        if decision.finished:
            self.finish_reason, self.stop_reason = decision.reason, decision.matched
        if finished and decision.trim_text_to is None and decision.matched is None:
            self.unsent += self.detok.flush()
        return finished

    def emit(self, finished: bool) -> RequestOutput:
        """The request's news since its last output (mutates what counts as sent)."""
        hold = 0 if finished else self.stop.holdback_len()
        num_chars = max(0, len(self.unsent) - hold)
        delta, self.unsent = self.unsent[:num_chars], self.unsent[num_chars:]
        ids = self.sampling.output_ids
        out = RequestOutput(
            request_id=self.request_id,
            prompt_len=len(self.seq.prompt_ids),
            cached_len=self.seq.cached_len,
            text=delta,
            token_ids=ids[self.sent_tokens :],
            num_tokens=len(ids),
            logprobs=self.logprobs if self.params.logprobs is not None else None,
            prompt_logprobs=self.prompt_logprobs if not self.first_sent else None,
            finished=finished,
            finish_reason=self.finish_reason if finished else None,
            stop_reason=self.stop_reason if finished else None,
        )
        self.sent_chars += num_chars
        self.sent_tokens, self.first_sent, self.logprobs = len(ids), True, []
        return out

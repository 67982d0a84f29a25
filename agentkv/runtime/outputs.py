"""What the engine hands back: per-step request outputs and engine-wide counters."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from agentkv.cache.disk_tier import DiskStats


class TokenLogprob(NamedTuple):
    token_id: int
    logprob: float
    top: list[tuple[int, float]]  # best (id, logprob), descending
    logits: tuple[float, ...] = ()  # raw logits of SamplingParams.logit_token_ids, in that order


@dataclass(slots=True)
class RequestOutput:
    """One step's news for a request: the text, token ids and logprobs generated since the
    previous output its reader took (deltas: a stream holds O(its output), never a copy of
    everything so far per step), and `num_tokens`, the whole output's length. Outputs that
    pile up unread are `merge`d into one; merging every output of a request gives the whole
    answer."""

    request_id: str
    prompt_len: int
    cached_len: int
    text: str
    token_ids: list[int]
    num_tokens: int = 0  # output tokens generated so far, this output's included
    logprobs: list[TokenLogprob] | None = None
    prompt_logprobs: list[TokenLogprob | None] | None = None
    finished: bool = False
    finish_reason: str | None = None  # "stop" | "length" | "abort" | "error"
    stop_reason: str | int | None = None
    error: str | None = None  # why the request failed inside a step (finish_reason "error")

    def merge(self, later: RequestOutput) -> None:
        """Append the next output of the same request (mutates self): deltas concatenate, the
        rest is the later output's."""
        if later.request_id != self.request_id:
            raise ValueError(f"cannot merge output of {later.request_id!r} into {self.request_id!r}")
        self.text += later.text
        self.token_ids.extend(later.token_ids)
        if later.logprobs is not None:
            if self.logprobs is None:
                self.logprobs = []
            self.logprobs.extend(later.logprobs)
        if self.prompt_logprobs is None:
            self.prompt_logprobs = later.prompt_logprobs
        self.num_tokens, self.cached_len = later.num_tokens, later.cached_len
        self.finished, self.finish_reason = later.finished, later.finish_reason
        self.stop_reason, self.error = later.stop_reason, later.error


class EngineStats(NamedTuple):
    num_running: int
    num_waiting: int
    kv_blocks_used: int
    kv_blocks_free: int
    prefix_queried_tokens: int
    prefix_hit_tokens: int
    evicted_blocks: int
    preemptions: int
    prompt_tokens: int = 0
    generation_tokens: int = 0
    computed_tokens: int = 0  # prefill + decode rows actually run through the model
    kv_blocks_cached: int = 0  # used blocks held only by the prefix cache (evictable)
    backend: str = ""  # what computes the bits: registry name, kernel ISA and build (None without kernels)
    isa: str | None = None
    kernel_build: str | None = None
    disk: DiskStats | None = None  # the KV disk tier's counters, when it is on
    spec_drafted_tokens: int = 0  # speculative decoding: draft tokens verified
    spec_accepted_tokens: int = 0  # draft tokens that were what the sampler picked
    spec_verify_steps: int = 0  # verification chunks run (one per drafting request per step)
    kv_blocks_pinned: int = 0  # blocks held by live cache_control pins (their prefixes' paths)
    step_failures: int = 0  # steps whose model run, copy or disk load raised (their requests failed)


@dataclass(slots=True)
class Counters:
    """Engine-owned running totals (mutated by the engine thread only)."""

    prompt_tokens: int = 0
    generation_tokens: int = 0
    computed_tokens: int = 0
    steps: int = 0
    spec_drafted_tokens: int = 0
    spec_accepted_tokens: int = 0
    spec_verify_steps: int = 0
    step_failures: int = 0


def merge_into(merged: dict[str, RequestOutput], out: RequestOutput) -> RequestOutput:
    """Fold `out` into `merged[out.request_id]` (mutates `merged`); returns that request's
    merged output so far: the whole answer once `out.finished`."""
    known = merged.get(out.request_id)
    if known is None:
        merged[out.request_id] = out
        return out
    known.merge(out)
    return known

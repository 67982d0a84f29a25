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
    """One step's news for a request: cumulative text/ids plus the delta since the last output."""

    request_id: str
    prompt_len: int
    cached_len: int
    text: str
    delta_text: str
    token_ids: list[int]
    delta_token_ids: list[int]
    logprobs: list[TokenLogprob] | None = None
    prompt_logprobs: list[TokenLogprob | None] | None = None
    finished: bool = False
    finish_reason: str | None = None  # "stop" | "length" | "abort" | "error"
    stop_reason: str | int | None = None
    error: str | None = None  # why the request failed inside a step (finish_reason "error")

    @property
    def completion_len(self) -> int:
        return len(self.token_ids)


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

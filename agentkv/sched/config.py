"""Scheduler knobs (batch width, token budget per step, chunked prefill) and the view of the
cache knobs the scheduler plans with."""

from __future__ import annotations

from dataclasses import dataclass


def _check_int(name: str, value: object, low: int, high: int | None = None, high_name: str = "") -> None:
    """ValueError naming the field, the value and the allowed range (bools are not ints here)."""
    ok = isinstance(value, int) and not isinstance(value, bool) and value >= low
    if ok and high is not None:
        ok = value <= high
    if not ok:
        top = f"{high_name}={high}" if high_name else str(high)
        allowed = f"[{low}, {top}]" if high is not None else f">= {low}"
        raise ValueError(f"{name}={value!r} is out of range: allowed an integer {allowed}")


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    """What the scheduler alone owns. The block size and prefix caching are the cache's knobs
    (runtime's CacheConfig); the scheduler receives them as a `CacheView`."""

    max_num_seqs: int = 64  # running sequences at once
    max_num_batched_tokens: int = 512  # tokens computed per step, decodes and prefills
    chunk_size: int | None = None  # longest prefill chunk of one sequence; None = budget

    def __post_init__(self) -> None:
        _check_int("max_num_seqs", self.max_num_seqs, 1)
        _check_int("max_num_batched_tokens", self.max_num_batched_tokens, 1)
        if self.chunk_size is not None:
            _check_int("chunk_size", self.chunk_size, 1, self.max_num_batched_tokens, "max_num_batched_tokens")

    @property
    def max_chunk_len(self) -> int:
        return self.max_num_batched_tokens if self.chunk_size is None else self.chunk_size


@dataclass(frozen=True, slots=True)
class CacheView:
    """The cache knobs the scheduler plans with, handed over by whoever owns them (the engine,
    from its CacheConfig). No defaults on purpose: a second default could drift from the owner's."""

    block_size: int  # tokens per KV block; must match the RadixCache and the backend
    enable_prefix_cache: bool

    def __post_init__(self) -> None:
        _check_int("block_size", self.block_size, 1)
        if not isinstance(self.enable_prefix_cache, bool):
            raise ValueError(f"enable_prefix_cache={self.enable_prefix_cache!r} must be a bool")

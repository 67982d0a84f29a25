"""Scheduler knobs: batch width, token budget per step, chunked prefill, prefix caching."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    max_num_seqs: int = 64  # running sequences at once
    max_num_batched_tokens: int = 512  # tokens computed per step, decodes and prefills
    chunk_size: int | None = None  # longest prefill chunk of one sequence; None = budget
    enable_prefix_cache: bool = True
    block_size: int = 16  # tokens per KV block; must match the cache and the backend

    def __post_init__(self) -> None:
        for name in ("max_num_seqs", "max_num_batched_tokens", "block_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}={value!r} must be an integer >= 1")
        if self.chunk_size is not None and not (
                isinstance(self.chunk_size, int)
                and 1 <= self.chunk_size <= self.max_num_batched_tokens):
            raise ValueError(f"chunk_size={self.chunk_size!r} must be None or an integer in "
                             f"[1, max_num_batched_tokens={self.max_num_batched_tokens}]")

    @property
    def max_chunk_len(self) -> int:
        return self.max_num_batched_tokens if self.chunk_size is None else self.chunk_size

"""The engine's published stats snapshot: counters and gauges, each kept as it changes, so
building one costs the same however large the cache is."""

from __future__ import annotations

from typing import Any

from agentkv.runtime.outputs import EngineStats


def compute_stats(engine: Any) -> EngineStats:
    """A fresh snapshot of `engine` (an Engine; engine thread only; walks nothing)."""
    c, counters, identity = engine.cache, engine.counters, engine.backend.identity
    return EngineStats(
        num_running=engine.scheduler.num_running,
        num_waiting=engine.scheduler.num_waiting,
        kv_blocks_used=engine.pool.num_used,
        kv_blocks_free=engine.pool.num_free,
        prefix_queried_tokens=c.queried_tokens,
        prefix_hit_tokens=c.hit_tokens,
        evicted_blocks=c.evicted_blocks,
        preemptions=engine.scheduler.preemptions,
        prompt_tokens=counters.prompt_tokens,
        generation_tokens=counters.generation_tokens,
        computed_tokens=counters.computed_tokens,
        kv_blocks_cached=engine.pool.num_cached_only,
        backend=engine.backend.name,
        isa=identity.isa,
        kernel_build=identity.kernel_build,
        disk=engine.disk.stats() if engine.disk is not None else None,
        spec_drafted_tokens=counters.spec_drafted_tokens,
        spec_accepted_tokens=counters.spec_accepted_tokens,
        spec_verify_steps=counters.spec_verify_steps,
        kv_blocks_pinned=c.pins.num_blocks,
        step_failures=counters.step_failures,
    )

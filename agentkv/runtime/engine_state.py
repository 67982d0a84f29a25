"""The engine's published stats snapshot (counters and gauges, each kept as it changes, so
building one costs the same however large the cache is), and its LoRA settings."""

from __future__ import annotations

from typing import Any

from agentkv.runtime.adapters import check_lora_dtype
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


def configure_lora(
    engine: Any, max_loras: int | None = None, max_cpu_loras: int | None = None, dtype: str = "f32"
) -> None:
    """At most `max_loras` distinct adapters in one forward, `max_cpu_loras` loaded (LRU);
    adapters loaded from now on held in `dtype` (f32, or f16 where the backend reads it)."""
    for name, value in (("max_loras", max_loras), ("max_cpu_loras", max_cpu_loras)):
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            raise ValueError(f"{name}={value!r} must be None or an integer >= 1")
    engine.adapters.resize(max_cpu_loras)
    engine.adapters.dtype = check_lora_dtype(engine.backend, dtype)
    if engine.runner is not None:
        engine.runner.max_loras = max_loras

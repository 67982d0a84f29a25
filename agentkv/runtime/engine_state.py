"""The engine's introspection and cache upkeep: the published stats snapshot, prefix pins,
freeing the cache, the disk tier's loads and close."""

from __future__ import annotations

from collections.abc import Hashable

from agentkv.runtime.adapters import AdapterRegistry, check_lora_dtype
from agentkv.runtime.outputs import EngineStats


class EngineState:
    """Mixed into `Engine`, whose state (cache, pool, scheduler, counters, disk, backend) it reads;
    every method runs on the engine thread except `stats`, which any thread may call."""

    # -- introspection --------------------------------------------------------------------
    def stats(self) -> EngineStats:
        """The counters and gauges as of the end of the last step, add or abort. Thread-safe:
        the engine thread publishes a new immutable snapshot after each of those, so a
        reader (the server's /metrics) never walks the radix tree while it changes."""
        return self._stats

    def _publish_stats(self) -> None:
        self._stats = self._compute_stats()  # one reference swap: readers see old or new

    def _compute_stats(self) -> EngineStats:
        """Engine thread only: walks the radix tree."""
        c = self.cache
        return EngineStats(
            num_running=self.scheduler.num_running,
            num_waiting=self.scheduler.num_waiting,
            kv_blocks_used=self.pool.num_used,
            kv_blocks_free=self.pool.num_free,
            prefix_queried_tokens=c.queried_tokens,
            prefix_hit_tokens=c.hit_tokens,
            evicted_blocks=c.evicted_blocks,
            preemptions=self.scheduler.preemptions,
            prompt_tokens=self.counters.prompt_tokens,
            generation_tokens=self.counters.generation_tokens,
            computed_tokens=self.counters.computed_tokens,
            kv_blocks_cached=sum(1 for b, n in c.block_refs().items() if self.pool.refcount(b) == n),
            backend=self.backend.name,
            isa=self.backend.identity.isa,
            kernel_build=self.backend.identity.kernel_build,
            disk=self.disk.stats() if self.disk is not None else None,
            spec_drafted_tokens=self.counters.spec_drafted_tokens,
            spec_accepted_tokens=self.counters.spec_accepted_tokens,
            spec_verify_steps=self.counters.spec_verify_steps,
        )

    def pin_prefix(self, token_ids: list[int], namespace: Hashable = None, ttl_s: float = 300.0) -> int:
        """Keep the cached prefix of `token_ids` (in a request `namespace`) from eviction for
        `ttl_s` seconds (mutates the cache); returns how many tokens are pinned."""
        return self.cache.pin((self.model_name, namespace), list(map(int, token_ids)), ttl_s)

    def free_cache(self) -> int:
        """Evict every unlocked cached block (mutates); returns how many returned to the pool."""
        num_freed = self.cache.evict(self.num_blocks)
        self._publish_stats()
        return num_freed

    # -- LoRA adapters (runtime/adapters.py) --------------------------------------------
    @property
    def adapters(self) -> AdapterRegistry:
        """The LoRA adapters this engine serves, by name (made on first use; thread-safe after)."""
        registry = self.__dict__.get("_adapters")
        if registry is None:
            registry = self.__dict__["_adapters"] = AdapterRegistry(self.model)
        return registry

    def configure_lora(
        self, max_loras: int | None = None, max_cpu_loras: int | None = None, dtype: str = "f32"
    ) -> None:
        """At most `max_loras` distinct adapters in one forward, `max_cpu_loras` loaded (LRU);
        adapters loaded from now on held in `dtype` (f32, or f16 where the backend reads it)."""
        for name, value in (("max_loras", max_loras), ("max_cpu_loras", max_cpu_loras)):
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                raise ValueError(f"{name}={value!r} must be None or an integer >= 1")
        self.adapters.resize(max_cpu_loras)
        self.adapters.dtype = check_lora_dtype(self.backend, dtype)
        if self.runner is not None:
            self.runner.max_loras = max_loras

    # -- the disk tier (runtime/kv_disk.py) ---------------------------------------------
    def _apply_loads(self, loads) -> None:
        """Write the disk payloads the scheduler planned into their fresh blocks (before the step)."""
        for block, payload in loads:
            self.backend.write_block(self.runner.kv, block, payload)

    def close(self) -> None:
        """Write back what the RAM cache holds (unlocked entries; write-through has them
        already), flush the disk tier and stop its writer. Idempotent; called by the engine
        thread when it stops (SIGTERM: the server's shutdown), or by a synchronous owner."""
        if self.disk is None:
            return
        if not self.config.cache.write_through:
            self.disk.wait_when_full = True
            self.cache.evict(self.num_blocks)
        self.disk.close()

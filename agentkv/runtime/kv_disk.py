"""The engine's side of the KV disk tier (`agentkv.cache.disk_tier`): opening it under the
engine fingerprint, write-through of the blocks a step filled, writing loaded blocks into the
KV store, write-back at close within a bound, and flushing a tenant's blocks.

Failures stay here: a block that cannot be read from the KV store for writing turns the tier
read-only (logged, counted); the engine runs on with RAM only."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Hashable, Sequence
from pathlib import Path
from typing import Any

from agentkv.cache import RadixCache
from agentkv.cache.disk_fingerprint import fingerprint_for
from agentkv.cache.disk_tier import DiskStats, DiskTier
from agentkv.sched import ScheduledChunk

log = logging.getLogger(__name__)
CLOSE_BOUND_S = 30.0  # write-back at shutdown waits at most this long, then says what it left


def tenant_of(namespace: Hashable) -> str:
    """The group a namespace's blocks are filed under on disk: its tenant (the engine's
    namespace is (model, request namespace), the server's is ("tenant", tenant, salt))."""
    inner = namespace[1] if isinstance(namespace, tuple) and len(namespace) > 1 else None
    tenant = inner[1] if isinstance(inner, tuple) and len(inner) > 1 and inner[0] == "tenant" else None
    return f"tenant:{tenant}" if tenant is not None else "shared"


class KVDisk:
    """The disk tier as the engine holds it: the tier, the KV store's block I/O, the mode."""

    def __init__(
        self,
        directory: str,
        capacity_bytes: int,
        fingerprint_parts: Sequence[tuple[str, str]],
        kv_spec: Any,
        block_io: tuple[Callable[[int], bytes], Callable[[int, bytes], None]],
        write_through: bool,
    ) -> None:
        self.read_block, self.write_block = block_io
        fingerprint = fingerprint_for(tuple(fingerprint_parts), kv_spec.block_size, kv_spec)
        self.tier = DiskTier(Path(directory), fingerprint, capacity_bytes, self.read_block, tenant_of)
        self.write_through = write_through
        self.block_size = kv_spec.block_size

    def attach(self, cache: RadixCache) -> None:
        """Write-back (unless write-through): blocks go to disk as the RAM cache evicts them."""
        if not self.write_through:
            cache.on_evict = self._guarded(self.tier.evict_listener(cache))

    def _guarded(self, offer: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any) -> Any:
            try:
                return offer(*args)
            except Exception as exc:  # noqa: BLE001 — a failing write never fails a step
                self.tier.fail("offering blocks", exc)
                return 0

        return call

    def after_step(self, chunks: list[ScheduledChunk]) -> None:
        """Write-through: offer the full blocks each chunk of the step just run completed
        (their KV is computed; call it before the scheduler ends any of them)."""
        if not self.write_through:
            return
        offer = self._guarded(self.tier.offer)
        for sc in chunks:
            end = sc.start + sc.num_tokens
            filled = range(sc.start // self.block_size, end // self.block_size)
            if filled:
                seq = sc.seq
                offer(seq.namespace, seq.all_ids[:end], {j: seq.block_table[j] for j in filled})

    def apply_loads(self, loads: list[tuple[int, bytes]]) -> None:
        """Write the payloads the scheduler planned into their fresh blocks (before the step)."""
        for block, payload in loads:
            self.write_block(block, payload)

    def remove(self, group: str | None) -> int:
        """Delete the blocks of one tenant group (`tenant_of`), or all with None."""
        return self.tier.remove(group)

    def close(self, cache: RadixCache | None = None, timeout_s: float = CLOSE_BOUND_S) -> int:
        """Write back what the RAM `cache` holds (none without it; write-through has it
        already), flush within `timeout_s`, stop the writer; returns the blocks left unwritten."""
        deadline = time.monotonic() + timeout_s
        if cache is not None and not self.write_through:
            self.tier.wait_until = deadline
            cache.evict(cache.pool.num_blocks)
        return self.tier.close(max(0.0, deadline - time.monotonic()))

    def stats(self) -> DiskStats:
        return self.tier.stats()

    def describe(self) -> str:
        stats = self.tier.stats()
        mode = "write-through" if self.write_through else "write-back"
        return f"KV disk tier {self.tier.dir} ({mode}): {stats.num_files} files, {stats.used_bytes} bytes"

"""The engine's side of the KV disk tier: opening it under the engine's fingerprint, and
write-through of the blocks a step filled. The tier itself is `agentkv.cache.disk_tier`."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

from agentkv.cache.disk_fingerprint import fingerprint_for
from agentkv.cache.disk_tier import DiskTier

if TYPE_CHECKING:
    from agentkv.runtime.engine import Engine
    from agentkv.sched.scheduler import ScheduledChunk

log = logging.getLogger(__name__)


def open_disk(engine: Engine) -> DiskTier | None:
    """The disk tier `engine.config.cache.disk_dir` asks for (None without one, or for an
    embedding model), keyed by the model's bytes, the backend and the KV layout. Write-back
    (the default) hooks it into the radix cache's eviction; write-through is `write_through`."""
    cc = engine.config.cache
    runner = engine.runner
    if cc.disk_dir is None or runner is None:
        return None
    backend = engine.backend
    fingerprint = fingerprint_for(
        engine.source.path, Path(cc.disk_dir), backend, engine.block_size, engine.model.kv_spec(1, engine.block_size)
    )
    disk = DiskTier(Path(cc.disk_dir), fingerprint, cc.disk_bytes, lambda block: backend.read_block(runner.kv, block))
    if not cc.write_through:
        engine.cache.on_evict = disk.evict_listener(engine.cache)
    stats = disk.stats()
    log.info(
        "KV disk tier %s (%s): %d files, %d of %d bytes",
        disk.dir,
        "write-through" if cc.write_through else "write-back",
        stats.num_files,
        stats.used_bytes,
        cc.disk_bytes,
    )
    return disk


def write_through(disk: DiskTier, scheduled: list[ScheduledChunk], block_size: int) -> None:
    """Offer the full blocks each chunk of the step just run has completed (their KV is
    computed; call it before the scheduler ends any of them)."""
    for sc in scheduled:
        end = sc.start + sc.num_tokens
        filled = range(sc.start // block_size, end // block_size)
        if filled:
            seq = sc.seq
            disk.offer(seq.namespace, seq.all_ids[:end], {j: seq.block_table[j] for j in filled})

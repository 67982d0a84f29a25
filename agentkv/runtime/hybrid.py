"""What the engine does differently for a hybrid model (recurrent layers with state snapshots):
where hits may resume, and how its blocks go to the disk tier with their snapshots."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from agentkv.cache.snapshots import Snapshots
from agentkv.hal.specs import KVSpec
from agentkv.models.hybrid_memory import auto_snapshot_every

BlockIO = tuple[Callable[[int], bytes], Callable[[int, bytes], None]]


def snapshot_every(model: Any, block_size: int, every: int | None) -> int:
    """Blocks between a hybrid's state snapshots (`hal/state_store.py`): `every` when given,
    else `models/hybrid_memory.py`'s auto_snapshot_every; 1 for a model without recurrent state."""
    if every is not None or not model.state_bytes:
        return every or 1
    return auto_snapshot_every(model.state_bytes, block_size)


def snapshots_of(runner: Any, kv_block_bytes: int) -> Snapshots | None:
    """A hybrid's snapshots for the scheduler (cache/snapshots.py): hits resume only from a
    state snapshot; None for other models, which resume at any token."""
    states = runner.states if runner is not None else None
    if states is None:
        return None
    flag = kv_block_bytes + states.bytes_per_slot  # read_slot's last byte: 1 for a snapshot
    return Snapshots(states.has, lambda payload: payload[flag] == 1, states.release_running)


def disk_layout(model: Any, runner: Any, block_size: int) -> tuple[KVSpec, BlockIO]:
    """The layout the disk tier files a block under, and the block's read and write.

    A plain model's block is its K/V (`Backend.read_block`). A hybrid's block file also holds
    the block's state slot, the snapshot at its end (or zeros and a 0 flag where the block
    keeps none), after the K/V, zero-padded to whole
    virtual layers so that the tier's shape (and with it the fingerprint: its own layout,
    never confused with a K/V-only file) stays `[layers, 2, block_size, kv_heads, head_dim]`:

        | K/V of the attention layers | state slot (f32) | flag | zeros | = `num_layers` virtual layers
    """
    kv, backend, states = runner.kv, model.backend, runner.states
    spec = model.kv_spec(1, block_size)
    read = lambda b: backend.read_block(kv, b)  # noqa: E731
    write = lambda b, payload: backend.write_block(kv, b, payload)  # noqa: E731
    if states is None:
        return spec, (read, write)
    kv_bytes, layer_bytes = spec.bytes_per_block, spec.bytes_per_block // spec.num_layers
    slot_bytes = states.bytes_per_slot + 1  # the states and a snapshot flag (StateStore.read_slot)
    extra_layers = -(-slot_bytes // layer_bytes)
    padding = bytes(extra_layers * layer_bytes - slot_bytes)

    def read_hybrid(block: int) -> bytes:
        return read(block) + states.read_slot(block) + padding

    def write_hybrid(block: int, payload: bytes) -> None:
        write(block, payload[:kv_bytes])
        states.write_slot(block, payload[kv_bytes : kv_bytes + slot_bytes])

    return replace(spec, num_layers=spec.num_layers + extra_layers), (read_hybrid, write_hybrid)

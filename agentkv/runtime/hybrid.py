"""What the engine does differently for a hybrid model (recurrent layers with state snapshots):
where hits may resume, and how its blocks go to the disk tier with their snapshots."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from agentkv.hal.specs import KVSpec

BlockIO = tuple[Callable[[int], bytes], Callable[[int, bytes], None]]


def resume_align(model: Any, block_size: int) -> int:
    """Tokens a prefix hit is cut to a multiple of: a hybrid resumes only from the state
    snapshot at a block end (`cache/snapshots.py`); other models resume at any token."""
    return block_size if model.state_bytes else 1


def disk_layout(model: Any, runner: Any, block_size: int) -> tuple[KVSpec, BlockIO]:
    """The layout the disk tier files a block under, and the block's read and write.

    A plain model's block is its K/V (`Backend.read_block`). A hybrid's block file also holds
    the block's state slot, the snapshot at its end, after the K/V, zero-padded to whole
    virtual layers so that the tier's shape (and with it the fingerprint: its own layout,
    never confused with a K/V-only file) stays `[layers, 2, block_size, kv_heads, head_dim]`:

        | K/V of the attention layers | state slot (f32) | zeros | = `num_layers` virtual layers
    """
    kv, backend, states = runner.kv, model.backend, runner.states
    spec = model.kv_spec(1, block_size)
    read = lambda b: backend.read_block(kv, b)  # noqa: E731
    write = lambda b, payload: backend.write_block(kv, b, payload)  # noqa: E731
    if states is None:
        return spec, (read, write)
    kv_bytes, layer_bytes = spec.bytes_per_block, spec.bytes_per_block // spec.num_layers
    extra_layers = -(-states.bytes_per_slot // layer_bytes)
    padding = bytes(extra_layers * layer_bytes - states.bytes_per_slot)

    def read_hybrid(block: int) -> bytes:
        return read(block) + states.read_slot(block) + padding

    def write_hybrid(block: int, payload: bytes) -> None:
        write(block, payload[:kv_bytes])
        states.write_slot(block, payload[kv_bytes : kv_bytes + states.bytes_per_slot])

    return replace(spec, num_layers=spec.num_layers + extra_layers), (read_hybrid, write_hybrid)

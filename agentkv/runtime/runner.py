"""The model runner: turns one step's chunks into a flat batch + AttnMeta, runs the model,
and reads back the logits rows that will be sampled (the step's only host fence)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from agentkv.hal.base import AttnMeta
from agentkv.models.base import Model


class Chunk(NamedTuple):
    """`token_ids` at positions [start_pos, start_pos + len) of one sequence whose KV lives in
    `block_table`. `logits`: None (no row needed), "last" (its last row) or "all" (every row,
    for prompt logprobs)."""

    token_ids: Sequence[int]
    start_pos: int
    block_table: Sequence[int]
    logits: str | None = "last"


class ModelRunner:
    """Owns the paged KV store of one model. Not thread-safe: the engine thread drives it."""

    def __init__(self, model: Model, num_blocks: int, block_size: int):
        self.model, self.block_size, self.num_blocks = model, block_size, num_blocks
        self.backend = model.backend
        self.kv = self.backend.allocate_kv(model.kv_spec(num_blocks, block_size))

    def copy_blocks(self, pairs: list[tuple[int, int]]) -> None:
        if pairs:
            self.backend.copy_blocks(self.kv, pairs)

    def build(self, chunks: Sequence[Chunk]) -> tuple[np.ndarray, AttnMeta, np.ndarray]:
        """Flat token ids `[n]`, the step's AttnMeta and the row indices whose logits are read."""
        bs = self.block_size
        ids, positions, slots, rows = [], [], [], []
        row = 0
        for c in chunks:
            n = len(c.token_ids)
            pos = np.arange(c.start_pos, c.start_pos + n, dtype=np.int64)
            table = np.asarray(c.block_table, dtype=np.int64)
            if len(table) * bs < c.start_pos + n:
                raise RuntimeError(
                    f"block table of {len(table)} blocks cannot hold position "
                    f"{c.start_pos + n - 1} (block_size {bs}) — scheduler bug"
                )
            ids.append(np.asarray(c.token_ids, dtype=np.int64))
            positions.append(pos)
            slots.append(table[pos // bs] * bs + pos % bs)
            if c.logits == "last":
                rows.append(np.array([row + n - 1]))
            elif c.logits == "all":
                rows.append(np.arange(row, row + n))
            row += n
        meta = AttnMeta(
            query_lens=tuple(len(c.token_ids) for c in chunks),
            context_lens=tuple(c.start_pos + len(c.token_ids) for c in chunks),
            block_tables=tuple(tuple(int(b) for b in c.block_table) for c in chunks),
            positions=np.concatenate(positions),
            slot_mapping=np.concatenate(slots),
        )
        logit_rows = np.concatenate(rows) if rows else np.zeros(0, np.int64)
        return np.concatenate(ids), meta, logit_rows

    def run(self, chunks: Sequence[Chunk]) -> np.ndarray:
        """One forward step; returns float32 logits `[num_logit_rows, vocab]` in chunk order."""
        ids, meta, logit_rows = self.build(chunks)
        if len(logit_rows) == 0:
            # KV must still be written: run the model with one row requested and drop it.
            self.model.forward(ids, meta, self.kv, np.array([len(ids) - 1]))
            return np.zeros((0, self.model.vocab_size), np.float32)
        return self.backend.read(self.model.forward(ids, meta, self.kv, logit_rows))

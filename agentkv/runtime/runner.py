"""The model runner: turns one step's chunks into a flat batch + AttnMeta, runs the model,
and reads back the logits rows that will be sampled (the step's only host fence)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from agentkv.hal.base import AttnMeta
from agentkv.models.base import Model
from agentkv.runtime.adapters import Adapter, adapter_of, lora_step

__all__ = ["Chunk", "ModelRunner", "adapter_of"]


class Chunk(NamedTuple):
    """`token_ids` at positions [start_pos, start_pos + len) of one sequence whose KV lives in
    `block_table`. `logits`: None (no row needed), "last" (its last row) or "all" (every row,
    for prompt logprobs). `adapter`: the LoRA adapter its rows use (None: the base)."""

    token_ids: Sequence[int]
    start_pos: int
    block_table: Sequence[int]
    logits: str | None = "last"
    adapter: Adapter | None = None
    draft: bool = False  # a verification chunk (a hybrid's state records each row's state)


class ModelRunner:
    """Owns the paged KV store of one model. Not thread-safe: the engine thread drives it."""

    def __init__(self, model: Model, num_blocks: int, block_size: int, snapshot_every: int = 1):
        self.model, self.block_size, self.num_blocks = model, block_size, num_blocks
        self.backend = model.backend
        self.max_loras: int | None = None  # distinct LoRA adapters in one forward (None: any)
        self._lora = None  # the last step's LoraStep, whose pieces the next may reuse
        self.kv = self.backend.allocate_kv(model.kv_spec(num_blocks, block_size))
        # hybrids: a state slot per block, kept at every snapshot_every-th block end
        self.states = model.allocate_states(num_blocks, block_size, snapshot_every)

    def copy_blocks(self, pairs: list[tuple[int, int]]) -> None:
        if pairs:
            self.backend.copy_blocks(self.kv, pairs)
            if self.states is not None:
                self.states.copy(pairs)

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
        """One forward step; returns float32 logits `[num_logit_rows, vocab]` in chunk order.
        Rows of LoRA adapters run in one forward with the rest (a per-row adapter slot); with
        `max_loras`, chunks are cut into consecutive groups of at most that many adapters,
        one forward each (every row is batch-invariant, so the cut never changes a bit)."""
        groups = self._groups(chunks)
        if len(groups) > 1:
            return np.concatenate([self.run(g) for g in groups])
        ids, meta, logit_rows = self.build(chunks)
        for c in chunks:
            if c.adapter is not None:
                c.adapter.usage[1] += len(c.token_ids)  # the engine thread is its only writer
        lora = self._lora = lora_step([c.adapter for c in chunks], [len(c.token_ids) for c in chunks], self._lora)
        extra = {} if lora is None else {"lora": lora}
        if self.states is not None:
            extra["states"] = self.states
            self.states.begin_step(chunks)
        if len(logit_rows) == 0:
            # KV must still be written: run the model with one row requested and drop it.
            self.model.forward(ids, meta, self.kv, np.array([len(ids) - 1]), **extra)
            logits = np.zeros((0, self.model.vocab_size), np.float32)
        else:
            logits = self.backend.read(self.model.forward(ids, meta, self.kv, logit_rows, **extra))
        if self.states is not None:
            self.states.end_step()
        return logits

    def settle(self, chunks: Sequence[Chunk], num_computed: Sequence[int]) -> None:
        """After a step's verification: each chunk's sequence holds `num_computed` tokens of KV;
        a hybrid's recurrent state is put back to the last accepted token (hal/state_store.py)."""
        if self.states is not None:
            self.states.settle(chunks, num_computed)

    def _groups(self, chunks: Sequence[Chunk]) -> list[list[Chunk]]:
        """Consecutive runs of `chunks` that use at most `max_loras` distinct adapters each."""
        groups: list[list[Chunk]] = [[]]
        seen: set[int] = set()
        for c in chunks:
            new = c.adapter is not None and id(c.adapter) not in seen
            if new and self.max_loras is not None and len(seen) == self.max_loras and groups[-1]:
                groups.append([])
                seen = set()
            if c.adapter is not None:
                seen.add(id(c.adapter))
            groups[-1].append(c)
        return groups

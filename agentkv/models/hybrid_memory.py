"""The memory of a hybrid model (gated DeltaNet or Mamba-2 layers between attention layers):
paged K/V for the attention layers only, and one state snapshot per block holding every
recurrent layer's state. Mixed into the families (models/qwen3next.py, granite_hybrid.py),
whose `config` has `recurrent_layers` (True: a recurrent layer) and whose recurrent layers
share one state spec, `recurrent_spec`."""

from __future__ import annotations

from agentkv.hal.base import KVSpec
from agentkv.hal.recurrent import StateStore


class HybridMemory:
    @property
    def recurrent_spec(self):
        raise NotImplementedError

    def kv_spec(self, num_blocks: int, block_size: int) -> KVSpec:
        """Paged K/V for the attention layers only."""
        hp = self.hparams
        num_attention = self.config.recurrent_layers.count(False)
        return KVSpec(num_attention, num_blocks, block_size, hp.num_kv_heads, hp.head_dim, self.backend.kv_dtype)

    @property
    def state_bytes(self) -> int:
        """Bytes of one state snapshot (every recurrent layer's state)."""
        return self.recurrent_spec.state_bytes * self.config.recurrent_layers.count(True)

    def allocate_states(self, num_slots: int, block_size: int) -> StateStore:
        return StateStore([self.recurrent_spec] * self.config.recurrent_layers.count(True), num_slots, block_size)

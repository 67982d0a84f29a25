"""The memory of a hybrid model (gated DeltaNet or Mamba-2 layers between attention layers):
paged K/V for the attention layers only, and state snapshots at block ends (every k-th block
and where prefill chunks stop) holding every recurrent layer's state. Mixed into the
families (models/qwen3next.py, granite_hybrid.py), whose `config` has `recurrent_layers`
(True: a recurrent layer) and whose recurrent layers share one state spec, `recurrent_spec`."""

from __future__ import annotations

from agentkv.hal.base import KVSpec
from agentkv.hal.state_store import StateStore

# The snapshot spacing when `snapshot_every` is not given: the fewest blocks between snapshots
# that keep their memory under AUTO_BYTES_PER_TOKEN a token, at most AUTO_MAX_EVERY blocks.
AUTO_BYTES_PER_TOKEN = 64 * 1024
AUTO_MAX_EVERY = 16
DEFAULT_BLOCK_SIZE = 16  # what `inspect` reports the spacing for (CacheConfig's default)


def auto_snapshot_every(snapshot_bytes: int, block_size: int) -> int:
    """Blocks between snapshots when the knob is not given (see AUTO_BYTES_PER_TOKEN)."""
    return max(1, min(AUTO_MAX_EVERY, -(-snapshot_bytes // (AUTO_BYTES_PER_TOKEN * block_size))))


def snapshot_summary(snapshot_bytes: int, block_size: int = DEFAULT_BLOCK_SIZE) -> dict:
    """What `inspect` reports of a hybrid's snapshots: one's bytes, the default spacing at
    `block_size` and the bytes a token costs at that spacing."""
    every = auto_snapshot_every(snapshot_bytes, block_size)
    return {
        "snapshot_bytes": snapshot_bytes,
        "snapshot_every_blocks_default": every,
        "snapshot_bytes_per_token_default": snapshot_bytes / (every * block_size),
    }


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

    def allocate_states(self, num_slots: int, block_size: int, every: int = 1) -> StateStore:
        specs = [self.recurrent_spec] * self.config.recurrent_layers.count(True)
        return StateStore(specs, num_slots, block_size, every)

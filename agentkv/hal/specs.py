"""The shapes the compute contract passes around: rotary embedding specs, the paged KV store's
shape and one step's attention metadata (re-exported by `hal.base`)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any, NamedTuple

import numpy as np


class RopeStyle(str, Enum):
    NEOX = "neox"  # rotate halves: (x[i], x[i + d/2]) — HF llama/qwen layout
    INTERLEAVED = "interleaved"  # rotate pairs: (x[2i], x[2i+1]) — GGUF llama (q/k permuted)


@dataclass(frozen=True, slots=True)
class RopeSpec:
    """Rotary embedding: style, base, rotated dims and a frequency scaling rule."""

    dim: int
    theta: float = 10000.0
    style: RopeStyle = RopeStyle.NEOX
    # {"type": "linear"|"llama3"|"yarn", ...}; a dict is accepted and frozen into sorted items
    # so that specs hash (frequency tables are cached per spec).
    scaling: Any = ()

    def __post_init__(self):
        if self.dim <= 0 or self.dim % 2:
            raise ValueError(f"rope dim must be a positive even number, got {self.dim}")
        if isinstance(self.scaling, dict) or self.scaling is None:
            items = tuple(sorted((self.scaling or {}).items()))
            object.__setattr__(self, "scaling", items)

    @property
    def scaling_dict(self) -> dict[str, Any]:
        return dict(self.scaling)


# Element types a KV store may hold -> bytes per element. f16 halves KV memory and attention
# bandwidth; its values are rounded once, at the store, and read back exactly as f32.
KV_DTYPE_BYTES = {"f32": 4, "f16": 2}
KV_DTYPES = tuple(KV_DTYPE_BYTES)


def check_kv_dtype(dtype: object, name: str = "kv_dtype") -> str:
    """`dtype` when it is a KV element type; a ValueError naming the value and the choices."""
    if not isinstance(dtype, str) or dtype not in KV_DTYPE_BYTES:
        raise ValueError(f"{name}={dtype!r} is not allowed: use one of {', '.join(map(repr, KV_DTYPES))}")
    return dtype


# What a backend's matmuls take as activations: f32, or int8 rounded per row and 32-wide block
# (integer dot products; the cpu backend: AVX-512 VNNI or AVX2). Part of the fingerprint.
ACTIVATION_DTYPES = ("f32", "int8")
# What a config may ask for: one of those, or "auto", the backend's own choice (the first of
# its `activation_dtypes()`), resolved when the backend is set up.
ACTIVATION_CHOICES = ("auto", *ACTIVATION_DTYPES)


def check_activation_dtype(dtype: object, name: str = "activation_dtype") -> str:
    """`dtype` when it is an activation type or "auto"; a ValueError naming the value and the
    choices."""
    if not isinstance(dtype, str) or dtype not in ACTIVATION_CHOICES:
        raise ValueError(f"{name}={dtype!r} is not allowed: use one of {', '.join(map(repr, ACTIVATION_CHOICES))}")
    return dtype


@dataclass(frozen=True, slots=True)
class KVSpec:
    """Shape of the paged KV store: per layer, `[num_blocks, block_size, num_kv_heads, head_dim]`
    for K and the same for V, elements of `dtype` (KV_DTYPES).

    `latent` (multi-head latent attention, DeepSeek/Kimi): one vector per token and layer,
    `[num_blocks, block_size, 1, head_dim]`, no separate V — the K store is the value too
    (`| latent: kv_lora_rank | rope key: qk_rope_head_dim |`, attention reads V as K)."""

    num_layers: int
    num_blocks: int
    block_size: int
    num_kv_heads: int
    head_dim: int
    dtype: str = "f32"
    latent: bool = False

    def __post_init__(self):
        for name in ("num_layers", "num_blocks", "block_size", "num_kv_heads", "head_dim"):
            if getattr(self, name) <= 0:
                raise ValueError(f"KVSpec.{name} must be > 0, got {getattr(self, name)}")
        check_kv_dtype(self.dtype, "KVSpec.dtype")
        if self.latent and self.num_kv_heads != 1:
            raise ValueError(f"KVSpec.num_kv_heads must be 1 for a latent layout, got {self.num_kv_heads}")

    @property
    def num_stores(self) -> int:
        """Vectors stored per token, head and layer: K and V, or the one latent vector."""
        return 1 if self.latent else 2

    @property
    def element_bytes(self) -> int:
        return KV_DTYPE_BYTES[self.dtype]

    @property
    def bytes_per_block(self) -> int:
        per_vector = self.num_layers * self.block_size * self.num_kv_heads * self.head_dim * self.element_bytes
        return self.num_stores * per_vector

    @property
    def bytes_per_token(self) -> int:
        """K and V (or the latent vector) of one token across every layer."""
        return self.bytes_per_block // self.block_size


class AttnMeta(NamedTuple):
    """One step's batch, as the attention op sees it. Rows of the flat token batch are the
    sequences' new tokens, back to back:

        rows:  | seq 0: query_lens[0] | seq 1: query_lens[1] | ...
        seq i's rows sit at positions [context_lens[i] - query_lens[i], context_lens[i])

    `block_tables[i]` lists the KV blocks of seq i in order; token position p lives in
    block `block_tables[i][p // block_size]` at offset `p % block_size`.
    `slot_mapping[r]` = block * block_size + offset where row r's K/V are stored."""

    query_lens: tuple[int, ...]
    context_lens: tuple[int, ...]
    block_tables: tuple[tuple[int, ...], ...]
    positions: np.ndarray  # int64 [num_tokens]
    slot_mapping: np.ndarray  # int64 [num_tokens]

    @property
    def num_tokens(self) -> int:
        return int(sum(self.query_lens))

    @property
    def query_starts(self) -> list[int]:
        starts, acc = [], 0
        for n in self.query_lens:
            starts.append(acc)
            acc += n
        return starts

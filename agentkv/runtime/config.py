"""Engine configuration: composed frozen dataclasses, validated where they are built."""
from __future__ import annotations

from dataclasses import dataclass, field

from agentkv.sched import SchedulerConfig

DEFAULT_KV_MEMORY = 1 << 30  # 1 GiB of KV unless told otherwise


@dataclass(frozen=True, slots=True)
class CacheConfig:
    """KV store size: `num_blocks` wins over `memory_bytes`; neither = DEFAULT_KV_MEMORY."""

    block_size: int = 16
    num_blocks: int | None = None
    memory_bytes: int | None = None
    enable_prefix_cache: bool = True

    def __post_init__(self):
        if not 1 <= self.block_size <= 1024:
            raise ValueError(f"block_size must be in [1, 1024], got {self.block_size}")
        if self.num_blocks is not None and self.num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {self.num_blocks}")
        if self.memory_bytes is not None and self.memory_bytes < 1:
            raise ValueError(f"memory_bytes must be >= 1, got {self.memory_bytes}")


@dataclass(frozen=True, slots=True)
class EngineConfig:
    model: str
    backend: str = "cpu"
    weights: str = "resident"  # "resident" | "f32"
    max_model_len: int | None = None  # None = the model's context length
    cache: CacheConfig = field(default_factory=CacheConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    served_model_name: str | None = None

    def __post_init__(self):
        if self.weights not in ("resident", "f32"):
            raise ValueError(f"weights must be 'resident' or 'f32', got {self.weights!r}")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ValueError(f"max_model_len must be >= 2, got {self.max_model_len}")


def parse_size(text: str) -> int:
    """'512MiB', '2G', '1000000' -> bytes; a bad value raises ValueError naming it."""
    units = {"": 1, "k": 1e3, "kb": 1e3, "kib": 1024, "m": 1e6, "mb": 1e6, "mib": 1 << 20,
             "g": 1e9, "gb": 1e9, "gib": 1 << 30}
    s = text.strip().lower()
    num = s.rstrip("abcdefghijklmnopqrstuvwxyz")
    unit = s[len(num):]
    try:
        value = float(num) * units[unit]
    except (ValueError, KeyError):
        raise ValueError(f"cannot read size {text!r}; use e.g. 512MiB, 2GiB or a byte count") from None
    if value < 1:
        raise ValueError(f"size {text!r} must be positive")
    return int(value)

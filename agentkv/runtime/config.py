"""Engine configuration: composed frozen dataclasses, validated where they are built; each knob
has one owner field, and `KNOBS` names every knob once for keyword overrides and CLI flags."""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from agentkv.hal.specs import (  # noqa: F401  (the dtype tuples: re-exported for the CLI)
    ACTIVATION_CHOICES,
    KV_DTYPES,
    check_activation_dtype,
    check_kv_dtype,
)
from agentkv.sched import CacheView, SchedulerConfig
from agentkv.sched.draft import DRAFTERS

DEFAULT_BACKEND = "cpu"  # the one place the default compute backend is named
DEFAULT_KV_MEMORY = 1 << 30  # 1 GiB of KV unless told otherwise
DEFAULT_KV_DISK = 16 << 30  # the disk tier's budget unless told otherwise
WEIGHTS_MODES = ("resident", "f32")
MAX_BLOCK_SIZE = 1024
MAX_SPECULATIVE_TOKENS = 64


def _check_int(name: str, value: object, low: int, high: int | None = None, *, optional: bool = False) -> None:
    """ValueError naming the field, the value and the allowed range (bools are not ints here)."""
    if value is None and optional:
        return
    ok = isinstance(value, int) and not isinstance(value, bool) and value >= low
    if not ok or (high is not None and value > high):
        allowed = f"[{low}, {high}]" if high is not None else f">= {low}"
        raise ValueError(
            f"{name}={value!r} is out of range: allowed {'None or ' if optional else ''}an integer {allowed}"
        )


@dataclass(frozen=True, slots=True)
class CacheConfig:
    """The KV cache: its block size, whether prefixes are shared, its size and its element
    type. `num_blocks` wins over `memory_bytes`; neither = DEFAULT_KV_MEMORY. `memory_bytes`
    counts `dtype`'s element size: f16 holds twice the tokens of f32 in the same bytes."""

    block_size: int = 16  # tokens per KV block
    num_blocks: int | None = None
    memory_bytes: int | None = None
    enable_prefix_cache: bool = True
    disk_dir: str | None = None  # full blocks also kept in files here, across restarts
    disk_bytes: int = DEFAULT_KV_DISK  # the disk tier's budget (LRU within it)
    write_through: bool = False  # write blocks to disk at insert time instead of at eviction
    # K/V element type (KV_DTYPES). f16, the default (llama.cpp's too): half the KV memory and
    # attention bandwidth of f32 (SmolLM2 decode at 8K tokens 1.42x, prefill of 8K 1.16x), the
    # same greedy tokens as f32 K/V on both packaged models (docs/benchmarks.md); its values are
    # rounded once at the store, and a cache hit still gives the cold run's bits. "f32" keeps
    # the K/V the model computed, unrounded.
    dtype: str = "f16"
    # KV blocks that prefix pins (Anthropic `cache_control` breakpoints) may hold, in all and
    # per tenant; None = half and a quarter of the pool. Past either, a pin is not taken (the
    # response says so), so pins can never hold the blocks a request needs to run.
    max_pinned_blocks: int | None = None
    max_pinned_blocks_per_tenant: int | None = None
    # A hybrid model's recurrent-state snapshots (hal/state_store.py): kept at every k-th block
    # end (and where a prefill chunk stops); a hit resumes from the deepest one. None: the
    # fewest blocks that keep them under 64 KiB a token (models/hybrid_memory.py).
    snapshot_every: int | None = None

    def __post_init__(self) -> None:
        _check_int("block_size", self.block_size, 1, MAX_BLOCK_SIZE)
        _check_int("num_blocks", self.num_blocks, 1, optional=True)
        _check_int("memory_bytes", self.memory_bytes, 1, optional=True)
        _check_int("disk_bytes", self.disk_bytes, 1)
        _check_int("max_pinned_blocks", self.max_pinned_blocks, 0, optional=True)
        _check_int("snapshot_every", self.snapshot_every, 1, optional=True)
        _check_int("max_pinned_blocks_per_tenant", self.max_pinned_blocks_per_tenant, 0, optional=True)
        check_kv_dtype(self.dtype, "kv_cache_dtype")
        for name in ("enable_prefix_cache", "write_through"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name}={getattr(self, name)!r} must be True or False")
        if self.disk_dir is not None and (not isinstance(self.disk_dir, str) or not self.disk_dir):
            raise ValueError(f"disk_dir={self.disk_dir!r} must be a directory path or None")
        if self.disk_dir is not None and not self.enable_prefix_cache:
            raise ValueError("disk_dir needs enable_prefix_cache=True: the disk tier serves prefix hits")

    @property
    def view(self) -> CacheView:
        """What the scheduler plans with; derived, so the scheduler never holds a second copy."""
        return CacheView(block_size=self.block_size, enable_prefix_cache=self.enable_prefix_cache)


@dataclass(frozen=True, slots=True)
class EngineConfig:
    model: str
    backend: str = DEFAULT_BACKEND
    weights: str = "resident"  # "resident" keeps quantized weights quantized; "f32" dequantizes
    # What the matmuls take as activations (ACTIVATION_CHOICES): "int8" rounds them per row and
    # 32-wide block for integer dot products (the cpu backend, VNNI or AVX2); cache hits stay
    # exact. "auto": the backend's choice (int8 where the cpu backend has AVX-512 VNNI, else f32).
    activation_dtype: str = "auto"
    max_model_len: int | None = None  # None = the model's context length
    cache: CacheConfig = field(default_factory=CacheConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    served_model_name: str | None = None  # None = `model`
    speculative: str | None = None  # drafter of speculative decoding: "ngram", "suffix"; None = off
    # Most tokens drafted per request per step. 6: a SmolLM2 step of 1 + k rows costs little
    # more than one row up to 4 rows and about 1.8x one row at 8 (docs/benchmarks.md, "Small-batch
    # matmul"), and `agentkv bench spec` decodes fastest at 6-8 on turns that copy; the draft
    # length adapts down per request where drafts fail (sched/draft/base.py: DraftLength).
    num_speculative_tokens: int = 6
    # Requests that may wait for a running slot (beyond max_num_seqs); None = no bound.
    max_queued_requests: int | None = None
    # A stream whose reader takes nothing for this long while output waits is ended (its KV
    # freed); until then unread outputs merge into one (runtime/streams.py). None = never.
    stream_stall_s: float | None = 300.0

    def __post_init__(self) -> None:
        if not isinstance(self.model, str) or not self.model:
            raise ValueError(f"model={self.model!r} must be a model alias or path")
        if not isinstance(self.backend, str) or not self.backend:
            raise ValueError(f"backend={self.backend!r} must be a backend name")
        if self.weights not in WEIGHTS_MODES:
            raise ValueError(f"weights={self.weights!r} is not allowed: use 'resident' or 'f32'")
        check_activation_dtype(self.activation_dtype)
        _check_int("max_model_len", self.max_model_len, 2, optional=True)
        _check_int("max_queued_requests", self.max_queued_requests, 0, optional=True)
        stall = self.stream_stall_s
        if stall is not None and (isinstance(stall, bool) or not isinstance(stall, (int, float)) or not stall > 0):
            raise ValueError(f"stream_stall_s={stall!r} is out of range: allowed None or a number of seconds > 0")
        if not isinstance(self.cache, CacheConfig):
            raise ValueError(f"cache={self.cache!r} must be a CacheConfig")
        if not isinstance(self.scheduler, SchedulerConfig):
            raise ValueError(f"scheduler={self.scheduler!r} must be a SchedulerConfig")
        if self.speculative is not None and self.speculative not in DRAFTERS:
            raise ValueError(
                f"speculative={self.speculative!r} is not allowed: use None or one of {', '.join(sorted(DRAFTERS))}"
            )
        _check_int("num_speculative_tokens", self.num_speculative_tokens, 1, MAX_SPECULATIVE_TOKENS)


class Knob(NamedTuple):
    """One setting: its flat name (the `LLM(...)` / `AsyncEngine.from_model(...)` keyword; the
    CLI flags of agentkv.commands.config_flags are keyed by it too) and the one field that owns
    it. `section` is "" for EngineConfig itself, else the attribute holding the sub-config."""

    name: str
    section: str
    field: str


KNOBS: dict[str, Knob] = {
    k.name: k
    for k in (
        Knob("backend", "", "backend"),
        Knob("weights", "", "weights"),
        Knob("activation_dtype", "", "activation_dtype"),
        Knob("max_model_len", "", "max_model_len"),
        Knob("served_model_name", "", "served_model_name"),
        Knob("speculative", "", "speculative"),
        Knob("num_speculative_tokens", "", "num_speculative_tokens"),
        Knob("block_size", "cache", "block_size"),
        Knob("enable_prefix_cache", "cache", "enable_prefix_cache"),
        Knob("kv_cache_blocks", "cache", "num_blocks"),
        Knob("kv_cache_memory", "cache", "memory_bytes"),
        Knob("kv_cache_dir", "cache", "disk_dir"),
        Knob("kv_disk_size", "cache", "disk_bytes"),
        Knob("kv_write_through", "cache", "write_through"),
        Knob("kv_cache_dtype", "cache", "dtype"),
        Knob("max_num_seqs", "scheduler", "max_num_seqs"),
        Knob("max_num_batched_tokens", "scheduler", "max_num_batched_tokens"),
        Knob("chunk_size", "scheduler", "chunk_size"),
        Knob("max_queued_requests", "", "max_queued_requests"),
        Knob("stream_stall_timeout", "", "stream_stall_s"),
        Knob("max_pinned_blocks", "cache", "max_pinned_blocks"),
        Knob("max_pinned_blocks_per_tenant", "cache", "max_pinned_blocks_per_tenant"),
        Knob("snapshot_every", "cache", "snapshot_every"),
    )
}
_SECTIONS = {"cache": CacheConfig, "scheduler": SchedulerConfig}


def _owner(name: str) -> type:
    knob = KNOBS[name]
    return _SECTIONS[knob.section] if knob.section else EngineConfig


def knob_field(name: str) -> dataclasses.Field:
    """The dataclass field that owns knob `name` (its default and type come from there)."""
    return next(f for f in dataclasses.fields(_owner(name)) if f.name == KNOBS[name].field)


def knob_default(name: str) -> Any:
    f = knob_field(name)
    return f.default_factory() if f.default is dataclasses.MISSING else f.default


def knob_type(name: str) -> type:
    """The owning field's one concrete type: int for `int | None`, bool for `bool`, ..."""
    hint = typing.get_type_hints(_owner(name))[KNOBS[name].field]
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    return args[0] if len(args) == 1 else hint


def with_overrides(config: EngineConfig, **overrides: Any) -> EngineConfig:
    """`config` with knobs replaced by flat name (see KNOBS), or whole sections by `cache=` /
    `scheduler=` (applied first). Pure; the owners' __post_init__ validate the result. An
    unknown name is a TypeError listing the known ones."""
    unknown = sorted(set(overrides) - set(KNOBS) - set(_SECTIONS))
    if unknown:
        raise TypeError(f"unknown engine setting {unknown[0]!r}; known: {', '.join([*_SECTIONS, *KNOBS])}")
    top = {k: overrides[k] for k in _SECTIONS if k in overrides}
    nested: dict[str, dict[str, Any]] = {s: {} for s in _SECTIONS}
    for name, value in overrides.items():
        knob = KNOBS.get(name)
        if knob is None:
            continue
        if knob.section:
            nested[knob.section][knob.field] = value
        else:
            top[knob.field] = value
    config = dataclasses.replace(config, **top) if top else config
    parts = {s: dataclasses.replace(getattr(config, s), **kw) for s, kw in nested.items() if kw}
    return dataclasses.replace(config, **parts) if parts else config


def engine_config(model: str | EngineConfig, **overrides: Any) -> EngineConfig:
    """The EngineConfig for `model` (an alias/path, or a whole EngineConfig) with overrides."""
    base = model if isinstance(model, EngineConfig) else EngineConfig(model=model)
    return with_overrides(base, **overrides)


def parse_size(text: str) -> int:
    """'512MiB', '2G', '1000000' -> bytes; a bad value raises ValueError naming it."""
    units = {
        "": 1,
        "k": 1e3,
        "kb": 1e3,
        "kib": 1024,
        "m": 1e6,
        "mb": 1e6,
        "mib": 1 << 20,
        "g": 1e9,
        "gb": 1e9,
        "gib": 1 << 30,
    }
    s = text.strip().lower()
    num = s.rstrip("abcdefghijklmnopqrstuvwxyz")
    unit = s[len(num) :]
    try:
        value = float(num) * units[unit]
    except (ValueError, KeyError):
        raise ValueError(f"cannot read size {text!r}; use e.g. 512MiB, 2GiB or a byte count") from None
    if value < 1:
        raise ValueError(f"size {text!r} must be positive")
    return int(value)

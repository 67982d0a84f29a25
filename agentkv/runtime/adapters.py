"""LoRA adapters served on one base model: loading and attaching them to the model's weights,
their content identity in the cache namespace, the registry (names, LRU), and a step's slots.

Identity. An adapter's key is `("lora", digest, scale)`: the SHA-256 of its resolved modules
(formats/lora.py: every A and B byte, shapes and scalings, under a domain tag) and the scale a
request applies, as an exact hex float. It is the last element of the request namespace
(`request_namespace`), a typed tuple whose places never mix: a reload under the same name with
other weights gets another key and never meets the old KV; two names for the same weights
(and scale) share one key and its hits; a request's free-text fields (`cache_salt`) sit in
their own place, so no value of theirs can equal an adapter's or another tenant's key.
"""

from __future__ import annotations

import dataclasses
import threading
from collections import OrderedDict
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from agentkv.formats.lora import WEIGHTS_FILE, AdapterError, LoraAdapterFile, read_adapter
from agentkv.hal.lora import LoraPiece, LoraStep, expert_target, targets

F32, F16 = 0, 1  # GGML's qtypes


class UnknownAdapterError(KeyError):
    """A request or unload names an adapter that is not loaded."""

    def __init__(self, name: str, known: Sequence[str]):
        super().__init__(name)
        self.name, self.known = name, list(known)

    def __str__(self) -> str:
        return f"LoRA adapter {self.name!r} is not loaded (loaded: {', '.join(self.known) or 'none'})"


class AdapterKey(tuple):
    """`("lora", digest, scale hex)`, a plain tuple for every comparison, hash and JSON (the
    radix namespace and the disk tier's chain), that also carries the loaded `adapter` whose
    key it is, so the runner finds the weights a sequence's namespace names."""

    adapter: Adapter

    def __new__(cls, adapter: Adapter) -> AdapterKey:
        parts = ("lora", adapter.digest, float(adapter.scale).hex())
        key = super().__new__(cls, parts if adapter.dtype == "f32" else (*parts, adapter.dtype))
        key.adapter = adapter
        return key


@dataclass(eq=False)
class Adapter:
    """A loaded adapter: per base weight name, the (a, bt, scaling, col) it adds to that
    weight's output (uploaded weights; the delta is scaling * scale). Held by the requests that
    use it, so unloading it lets them finish."""

    name: str
    path: str
    digest: str
    scale: float
    rank: int
    pieces: dict[str, list[tuple[Any, Any, float, int]]]
    dtype: str = "f32"  # what A and B^T are held in: part of the key (f16 rounds the adapter)
    usage: list[int] = field(default_factory=lambda: [0, 0])  # [requests, computed tokens] of its name
    key: AdapterKey = field(init=False)

    def __post_init__(self) -> None:
        self.key = AdapterKey(self)

    def scaled(self, scale: float) -> Adapter:
        """This adapter at another `scale` (llama.cpp's per-request scale): the same weights
        and counters, another key."""
        if float(scale) == self.scale:
            return self
        other = dataclasses.replace(self, scale=float(scale))
        other.usage = self.usage
        return other


def request_namespace(tenant: str | None = None, cache_salt: str | None = None, adapter: Adapter | None = None):
    """The namespace a request's KV lives in: None (the shared one), or `("tenant", tenant,
    cache_salt)` followed by the adapter's key when it uses one."""
    if tenant is None and cache_salt is None and adapter is None:
        return None
    base = ("tenant", tenant, cache_salt)
    return base if adapter is None else (*base, adapter.key)


def adapter_of(namespace: Hashable) -> Adapter | None:
    """The adapter a (possibly engine-wrapped) namespace names, or None (the base)."""
    if isinstance(namespace, AdapterKey):
        return namespace.adapter
    if isinstance(namespace, tuple):
        for part in namespace:
            found = adapter_of(part)
            if found is not None:
                return found
    return None


def attach(model: Any, file: LoraAdapterFile, name: str, scale: float = 1.0, dtype: str = "f32") -> Adapter:
    """Check each module of `file` against the base model's weights and upload its pair in
    `dtype` (f32, or f16 where the backend reads it). Raises AdapterError naming the file,
    the module and both shapes."""
    layers, specs = getattr(model, "layers", None), getattr(model, "blocks", None)
    if not getattr(model, "supports_lora", False) or layers is None:
        raise AdapterError(f"{file.path}: {type(model).__name__} cannot take LoRA adapters")
    if file.arch is not None and file.arch != model.hparams.arch:
        raise AdapterError(f"{file.path}: an adapter for {file.arch!r}, the base model is {model.hparams.arch!r}")
    pieces: dict[str, list[tuple[Any, Any, float, int]]] = {}
    where = Path(file.path) / WEIGHTS_FILE
    for m in file.modules:
        if m.layer >= len(layers):
            raise AdapterError(f"{where}: module {m.name!r} is in layer {m.layer}; the model has {len(layers)}")
        if m.expert >= 0:
            target = expert_target(layers[m.layer], m.kind, m.expert)
            if target is None:
                raise AdapterError(f"{where}: module {m.name!r}: layer {m.layer} has no routed expert {m.expert}")
        else:
            target = targets(layers[m.layer], specs[m.layer]).get(m.kind)
        if target is None:
            raise AdapterError(f"{where}: module {m.name!r}: layer {m.layer} has no dense {m.kind} projection")
        if m.a.shape[1] != target.inp or m.b.shape[0] != target.out:
            raise AdapterError(
                f"{where}: module {m.name!r}: lora_A {list(m.a.shape)} and lora_B {list(m.b.shape)} do not fit "
                f"the base model's {m.kind} projection [{target.out}, {target.inp}] ({target.weight.name})"
            )
        a, bt = _pair(model, f"lora.{name}.{target.weight.name}.{m.kind}", m, dtype)
        pieces.setdefault(target.weight.name, []).append((a, bt, m.scaling, target.col))
    return Adapter(name, file.path, file.digest, float(scale), file.rank, pieces, dtype)


def _pair(model: Any, stem: str, m: Any, dtype: str) -> tuple[Any, Any]:
    """A module's A and B^T (rows in the base weight's order) uploaded in `dtype`; f16 only
    where every row is whole GGUF blocks of 32 values (upload_weight keeps those as they are)."""
    kind = dtype if m.a.shape[1] % 32 == 0 and m.b.shape[0] % 32 == 0 else "f32"
    bt = _base_rows(model, m).T
    return _upload(model.backend, stem + ".a", m.a, kind), _upload(model.backend, stem + ".bt", bt, kind)


def _upload(backend: Any, name: str, array: np.ndarray, dtype: str) -> Any:
    """An adapter matrix as the LoRA op reads it: f32, or f16 (half the bytes a decode step
    reads per adapter, at the cost of rounding the adapter's values once)."""
    if dtype == "f16":
        data = np.ascontiguousarray(array, dtype=np.float16)
        return backend.upload_weight(name, data, F16, data.shape, resident=True)
    return backend.upload_weight(name, np.ascontiguousarray(array, dtype=np.float32), F32, array.shape, resident=False)


def check_lora_dtype(backend: Any, dtype: str) -> str:
    """`dtype` if the backend's LoRA op reads it (ValueError naming the allowed ones)."""
    allowed = getattr(backend, "lora_dtypes", ("f32",))
    if dtype not in allowed:
        raise ValueError(f"lora_dtype={dtype!r} is not supported by backend {backend.name!r}: use one of {allowed}")
    return dtype


def _base_rows(model: Any, m: Any) -> np.ndarray:
    """B's rows in the base weight's row order: llama.cpp's converter permutes a GGUF llama's
    q/k rows (rope pairs adjacent), in its base and in its adapters' B alike; a PEFT B meets
    a permuted base, or a llama.cpp B an HF base, through that permutation or its inverse."""
    base = bool(getattr(getattr(model.config, "attention", model.config), "interleaved", False))
    if m.kind not in ("q", "k") or base == m.interleaved:
        return m.b
    hp, b = model.hparams, m.b
    heads = hp.num_heads if m.kind == "q" else hp.num_kv_heads
    if base:
        return b.reshape(heads, 2, b.shape[0] // heads // 2, b.shape[1]).swapaxes(1, 2).reshape(b.shape)
    return b.reshape(heads, b.shape[0] // heads // 2, 2, b.shape[1]).swapaxes(1, 2).reshape(b.shape)


def lora_step(
    adapters: Sequence[Adapter | None], rows_per_chunk: Sequence[int], previous: LoraStep | None = None
) -> LoraStep | None:
    """A step's slots (one per distinct adapter, in order of first use) and pieces, for chunks
    of `rows_per_chunk` rows using `adapters`; None when no chunk uses one. The pieces of the
    `previous` step are reused when it had the same adapters in the same slots (decode steps)."""
    slots: dict[int, int] = {}
    used: list[Adapter] = []
    for adapter in adapters:
        if adapter is not None and id(adapter) not in slots:
            slots[id(adapter)] = len(used)
            used.append(adapter)
    if not used:
        return None
    row_slots = np.concatenate(
        [np.full(n, -1 if a is None else slots[id(a)], np.int32) for a, n in zip(adapters, rows_per_chunk)]
    )
    owners = tuple(used)
    if previous is not None and len(previous.owners) == len(owners):
        if all(a is b for a, b in zip(previous.owners, owners)):
            return LoraStep(row_slots, previous.pieces, owners)
    pieces: dict[str, list[LoraPiece]] = {}
    for slot, adapter in enumerate(used):
        for weight_name, parts in adapter.pieces.items():
            pieces.setdefault(weight_name, []).extend(
                LoraPiece(slot, a, bt, s * adapter.scale, c) for a, bt, s, c in parts
            )
    return LoraStep(row_slots, {k: tuple(v) for k, v in pieces.items()}, owners)


class AdapterRegistry:
    """The adapters one engine serves, by name. Thread-safe (the server loads and resolves,
    the engine thread only reads the Adapter objects requests hold). At most `max_cpu_loras`
    stay loaded: the least recently used is dropped and reloaded from its path on next use."""

    def __init__(self, model: Any, max_cpu_loras: int | None = None, dtype: str = "f32"):
        self.model, self.max_cpu_loras = model, max_cpu_loras
        self.dtype = check_lora_dtype(model.backend, dtype)  # what adapters loaded from now on are held in
        self._paths: dict[str, tuple[str, float]] = {}  # every registered name -> (path, scale)
        self._loaded: OrderedDict[str, Adapter] = OrderedDict()  # LRU: most recent last
        self._lock = threading.Lock()
        self._usage: dict[str, list[int]] = {}  # name -> [requests, computed tokens], kept across reloads

    def load(self, name: str, path: str, scale: float = 1.0) -> Adapter:
        """Read and attach the adapter at `path` under `name` (replacing any adapter of that
        name; requests already running keep theirs). Raises AdapterError for a bad folder."""
        if not name or not isinstance(name, str):
            raise AdapterError(f"adapter name must be a non-empty string, got {name!r}")
        adapter = attach(self.model, read_adapter(path), name, scale, self.dtype)
        with self._lock:
            adapter.usage = self._usage.setdefault(name, [0, 0])
            self._paths[name] = (str(path), float(scale))
            self._loaded[name] = adapter
            self._loaded.move_to_end(name)
            self._evict()
        return adapter

    def unload(self, name: str) -> None:
        """Forget `name` (raises UnknownAdapterError); running requests that use it finish."""
        with self._lock:
            if name not in self._paths:
                raise UnknownAdapterError(name, list(self._paths))
            del self._paths[name]
            self._loaded.pop(name, None)

    def get(self, name: str) -> Adapter:
        """The adapter registered as `name`, reloaded from its path if the LRU dropped it."""
        with self._lock:
            if name not in self._paths:
                raise UnknownAdapterError(name, list(self._paths))
            adapter = self._loaded.get(name)
            if adapter is not None:
                self._loaded.move_to_end(name)
                return adapter
            path, scale = self._paths[name]
        return self.load(name, path, scale)

    def resize(self, max_cpu_loras: int | None) -> None:
        """Keep at most `max_cpu_loras` loaded from now on (drops the least recent at once)."""
        with self._lock:
            self.max_cpu_loras = max_cpu_loras
            self._evict()

    def names(self) -> list[str]:
        with self._lock:
            return list(self._paths)

    def num_loaded(self) -> int:
        return len(self._loaded)

    def paths(self) -> dict[str, str]:
        """Every registered name -> the path it loads from."""
        with self._lock:
            return {name: path for name, (path, _) in self._paths.items()}

    def usage(self) -> dict[str, tuple[int, int]]:
        """Name -> (requests, tokens computed through it) since start (the server's metrics)."""
        with self._lock:
            return {name: (u[0], u[1]) for name, u in self._usage.items()}

    def _evict(self) -> None:
        while self.max_cpu_loras is not None and len(self._loaded) > self.max_cpu_loras:
            self._loaded.popitem(last=False)

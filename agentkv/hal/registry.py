"""Backend registry: backends register by name and are imported only when chosen. `lookup`
never falls back: it returns the named backend or raises, naming the cause."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import NamedTuple

from agentkv.hal.base import Backend, BackendClass, BackendUnavailable

__all__ = ["BackendUnavailable", "UnknownBackend", "backend_class", "lookup", "names", "register"]


class UnknownBackend(ValueError):
    """A backend name nobody registered."""


class _Entry(NamedTuple):
    klass: BackendClass
    factory: Callable[[], Backend] | str  # a callable, or "module:attr" imported on demand


_REGISTRY: dict[str, _Entry] = {}


def register(name: str, factory: Callable[[], Backend] | str, klass: BackendClass) -> None:
    """Register a backend factory under `name` (replaces an earlier entry of that name)."""
    if klass not in ("reference", "approx"):
        raise ValueError(f"backend class must be 'reference' or 'approx', got {klass!r}")
    _REGISTRY[name] = _Entry(klass, factory)


def names() -> list[str]:
    return sorted(_REGISTRY)


def backend_class(name: str) -> BackendClass:
    return _entry(name).klass


def _entry(name: str) -> _Entry:
    if name not in _REGISTRY:
        raise UnknownBackend(f"unknown backend {name!r}; registered: {', '.join(names())}")
    return _REGISTRY[name]


def lookup(name: str, kv_dtype: str = "f32", activation_dtype: str = "f32") -> Backend:
    """The named backend with those KV and activation types (Backend.set_kv_dtype,
    set_activation_dtype: a ValueError names a type it refuses), or BackendUnavailable (naming
    why it cannot run here) or UnknownBackend. Never another backend: a factory that builds one
    named otherwise is a bug."""
    factory = _entry(name).factory
    if isinstance(factory, str):
        module_name, attr = factory.split(":")
        try:
            factory = getattr(importlib.import_module(module_name), attr)
        except ImportError as e:
            raise BackendUnavailable(f"backend {name!r} needs a missing dependency: {e}") from e
    backend = factory()
    if backend.name != name:
        raise RuntimeError(f"backend {name!r}'s factory built backend {backend.name!r} (a registry bug)")
    return backend.set_kv_dtype(kv_dtype).set_activation_dtype(activation_dtype)


register("reference", "agentkv.hal.reference:ReferenceBackend", "reference")
register("cpu", "agentkv.hal.cpu:CpuBackend", "approx")
register("torch", "agentkv.hal.portable:TorchBackend", "approx")
register("torch-cuda", "agentkv.hal.portable:cuda_backend", "approx")
register("cuda", "agentkv.hal.cuda:cuda_backend", "approx")

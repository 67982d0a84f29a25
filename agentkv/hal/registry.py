"""Backend registry: backends register by name; `lookup` never falls back, `pick` falls back
to the reference backend. Backends are imported only when chosen."""
from __future__ import annotations

import importlib
import logging
from typing import Callable, NamedTuple

from agentkv.hal.base import Backend, BackendClass

log = logging.getLogger(__name__)


class BackendUnavailable(RuntimeError):
    """A registered backend that cannot run here (no device, missing dependency)."""


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


def lookup(name: str) -> Backend:
    """The named backend, or BackendUnavailable/UnknownBackend — never another backend."""
    factory = _entry(name).factory
    if isinstance(factory, str):
        module_name, attr = factory.split(":")
        try:
            factory = getattr(importlib.import_module(module_name), attr)
        except ImportError as e:
            raise BackendUnavailable(f"backend {name!r} needs a missing dependency: {e}") from e
    return factory()


def pick(name: str) -> Backend:
    """The named backend if it can run here, else the reference backend (logged)."""
    try:
        return lookup(name)
    except BackendUnavailable as e:
        log.warning("%s; falling back to the reference backend", e)
        return lookup("reference")


register("reference", "agentkv.hal.reference:ReferenceBackend", "reference")
register("torch", "agentkv.hal.torch_backend:TorchBackend", "approx")
register("torch-cuda", "agentkv.hal.torch_backend:cuda_backend", "approx")

"""LoRA adapters over HTTP: which adapter a request's `model` names (`adapter` or SGLang's
`base:adapter`), vLLM's load/unload endpoints, the adapters' /v1/models cards and metrics.

The adapters themselves live in the engine's registry (runtime/adapters.py); the server only
resolves names and passes the adapter's cache key on in the request namespace."""

from __future__ import annotations

import asyncio
from collections.abc import Hashable, Iterator
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI
from fastapi.responses import PlainTextResponse
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from pydantic import BaseModel

from agentkv.formats.lora import AdapterError
from agentkv.runtime.adapters import UnknownAdapterError
from agentkv.server.errors import APIError, bad_request

if TYPE_CHECKING:
    from agentkv.server.lifecycle import ServerState


class LoadLoRAAdapterRequest(BaseModel):
    """vLLM's body. `load_inplace`: replace an adapter already loaded under this name."""

    lora_name: str
    lora_path: str
    load_inplace: bool = False


class UnloadLoRAAdapterRequest(BaseModel):
    lora_name: str
    lora_int_id: int | None = None  # vLLM's, accepted and unused: names identify adapters here


def registry_of(engine: Any):
    """The engine's adapter registry, or None for an engine without one."""
    return getattr(engine, "adapters", None)


def adapter_name(state: ServerState, engine: Any, model: str | None) -> str | None:
    """The adapter `model` names (`adapter`, or `base:adapter` with a served base), else None."""
    registry = registry_of(engine)
    if model is None or registry is None:
        return None
    base, sep, rest = model.partition(":")
    if sep and base in (state.model_name, engine.model_name) and rest in registry.names():
        return rest
    return model if model in registry.names() else None


def echoed_model(state: ServerState, engine: Any, req: Any) -> str:
    """The model a response names: an adapter as the request's `model` named it (`a` or
    `base:a`, as vLLM and SGLang echo it), else the served name (llama.cpp's `lora` list
    leaves `model` the base's)."""
    if getattr(req, "lora", None) is None and adapter_name(state, engine, req.model) is not None:
        return req.model
    return state.model_name


def requested(state: ServerState, engine: Any, req: Any) -> tuple[str | None, float | None]:
    """(adapter name, scale or None) a request asks for: llama.cpp's `lora` list when given
    (the one entry whose scale is not 0), else the adapter its `model` names."""
    entries = [e for e in getattr(req, "lora", None) or [] if e.scale != 0]
    if getattr(req, "lora", None) is None:
        return adapter_name(state, engine, req.model), None
    if len(entries) > 1:
        raise bad_request(f"lora: {len(entries)} adapters with a scale; agentkv applies one per request", param="lora")
    if not entries:
        return None, None
    names = registry_of(engine).names() if registry_of(engine) is not None else []
    if not 0 <= entries[0].id < len(names):
        raise bad_request(f"lora: id {entries[0].id} is not an adapter (ids 0..{len(names) - 1})", param="lora")
    return names[entries[0].id], entries[0].scale


async def request_adapter(state: ServerState, engine: Any, req: Any, namespace: Hashable) -> Hashable:
    """`namespace` with the adapter the request asks for (if any) at its own place: loaded
    (again, when the LRU dropped it) off the event loop, and its request counted."""
    name, scale = requested(state, engine, req)
    if name is None:
        return namespace
    try:
        adapter = await asyncio.to_thread(registry_of(engine).get, name)
    except UnknownAdapterError as exc:  # unloaded between the check and here
        raise APIError(404, str(exc), param="model", code="model_not_found") from exc
    except AdapterError as exc:
        raise bad_request(str(exc), param="model") from exc
    adapter = adapter if scale is None else adapter.scaled(scale)
    adapter.usage[0] += 1
    return ("tenant", None, None, adapter.key) if namespace is None else (*namespace, adapter.key)


def lora_cards(engine: Any, parent: str, created: int) -> list[dict[str, Any]]:
    """A /v1/models card per registered adapter, with its parent (vLLM's shape)."""
    registry = registry_of(engine)
    if registry is None:
        return []
    return [
        {"id": name, "created": created, "parent": parent, "root": path, "max_model_len": engine.max_model_len}
        for name, path in registry.paths().items()
    ]


def lora_metrics(engine: Any) -> Iterator[Any]:
    """`agentkv_lora_adapters_loaded`, and requests and computed tokens per adapter name."""
    registry = registry_of(engine)
    if registry is None:
        return
    yield GaugeMetricFamily("agentkv_lora_adapters_loaded", "LoRA adapters loaded", value=registry.num_loaded())
    requests = CounterMetricFamily("agentkv_lora_requests", "Requests per LoRA adapter", labels=["adapter"])
    tokens = CounterMetricFamily(
        "agentkv_lora_tokens", "Tokens computed through each LoRA adapter (prefill and decode)", labels=["adapter"]
    )
    for name, usage in registry.usage().items():
        requests.add_metric([name], usage[0])
        tokens.add_metric([name], usage[1])
    yield requests
    yield tokens


async def load_adapter(state: ServerState, req: LoadLoRAAdapterRequest) -> str:
    registry = registry_of(state.require_engine())
    if registry is None:
        raise bad_request("this engine cannot serve LoRA adapters", param="lora_name")
    if req.lora_name in registry.names() and not req.load_inplace:
        raise bad_request(
            f"The lora adapter {req.lora_name!r} has already been loaded; set load_inplace to replace it",
            param="lora_name",
        )
    if req.lora_name in (state.model_name, state.require_engine().model_name) or ":" in req.lora_name:
        raise bad_request(f"lora_name {req.lora_name!r} is the base model's name or holds ':'", param="lora_name")
    try:
        await asyncio.to_thread(registry.load, req.lora_name, req.lora_path)
    except AdapterError as exc:
        raise bad_request(str(exc), param="lora_path") from exc
    return f"Success: LoRA adapter '{req.lora_name}' added successfully."


async def unload_adapter(state: ServerState, req: UnloadLoRAAdapterRequest) -> str:
    registry = registry_of(state.require_engine())
    try:
        if registry is None:
            raise UnknownAdapterError(req.lora_name, [])
        registry.unload(req.lora_name)
    except UnknownAdapterError as exc:
        raise APIError(404, str(exc), param="lora_name", code="model_not_found") from exc
    return f"Success: LoRA adapter '{req.lora_name}' removed successfully."


def add_lora_routes(app: FastAPI, state: ServerState, auth: list[Any], errors: dict) -> None:
    @app.post("/v1/load_lora_adapter", response_class=PlainTextResponse, responses=errors, dependencies=auth)
    async def load_lora_adapter(req: LoadLoRAAdapterRequest) -> str:
        return await load_adapter(state, req)

    @app.post("/v1/unload_lora_adapter", response_class=PlainTextResponse, responses=errors, dependencies=auth)
    async def unload_lora_adapter(req: UnloadLoRAAdapterRequest) -> str:
        return await unload_adapter(state, req)

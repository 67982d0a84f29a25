"""Operator routes: flushing the prefix cache (SGLang's `POST /flush_cache`, vLLM's
`POST /reset_prefix_cache`) and the key check of `/metrics`.

Who may flush what: with no API keys configured, the one shared cache, all of it. With keys,
a tenant's key flushes that tenant's cache (RAM and disk, every cache_salt of it) and nothing
else; the `--admin-api-key` may flush one named tenant (`?tenant=NAME`) or all (no query)."""

from __future__ import annotations

import secrets
from typing import Any

from fastapi import FastAPI, Request
from pydantic import BaseModel

from agentkv.runtime.engine import ALL_TENANTS
from agentkv.server.errors import APIError, unauthorized
from agentkv.server.guard import authenticate
from agentkv.server.lifecycle import ServerState


class FlushResponse(BaseModel):
    object: str = "cache.flush"
    tenant: str | None  # None: every tenant
    freed_blocks: int  # RAM blocks returned to the pool (the disk tier's files go too)


def _is_admin(state: ServerState, request: Request) -> bool:
    admin = state.limits.admin_key
    if admin is None:
        return False
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    given = token.strip() if scheme.lower() == "bearer" else request.headers.get("x-api-key", "")
    return secrets.compare_digest(given.encode(), admin.encode())


def flush_target(state: ServerState, request: Request) -> tuple[object, str | None]:
    """(what Engine.flush_cache takes, the tenant named in the answer) for this caller."""
    asked = request.query_params.get("tenant")
    if _is_admin(state, request):
        return (ALL_TENANTS, None) if asked is None else (f"tenant:{asked}", asked)
    tenant = authenticate(state, request)  # 401 for a missing or unknown key
    if tenant is None:
        if asked is not None:
            raise APIError(400, "this server has no API keys: there are no tenants to name", param="tenant")
        return ALL_TENANTS, None
    if asked is not None and asked != tenant:
        raise APIError(403, "a tenant's key flushes only its own cache", type="permission_error", code="forbidden")
    return f"tenant:{tenant}", tenant


def check_metrics_access(state: ServerState, request: Request) -> None:
    """/metrics is every tenant's counters: behind the keys when there are keys."""
    if state.limits.public_metrics or not state.tenants or _is_admin(state, request):
        return
    if authenticate(state, request) is None:
        raise unauthorized()


def add_admin_routes(app: FastAPI, state: ServerState) -> None:
    async def flush(request: Request) -> Any:
        target, tenant = flush_target(state, request)
        engine = state.require_engine()
        freed = await engine.flush_cache(target)
        return FlushResponse(tenant=tenant, freed_blocks=freed)

    for path in ("/flush_cache", "/reset_prefix_cache"):
        app.add_api_route(path, flush, methods=["POST"], response_model=FlushResponse)

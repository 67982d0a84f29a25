"""What stands between a client and the engine: API keys and their tenants, the body-size cap,
the per-tenant cache namespace, and the watch that stops the server once its engine is lost
(so /health and the exit code tell a supervisor the truth)."""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Hashable
from typing import Any

from fastapi import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from agentkv.server.errors import ErrorShape, shaped_error, too_large, unauthorized
from agentkv.server.lifecycle import ServerState

log = logging.getLogger("agentkv.server")

ENGINE_WATCH_S = 0.2  # how soon a dead engine thread stops the server
_BODY_METHODS = {"POST", "PUT", "PATCH"}


def authenticate(state: ServerState, request: Request) -> str | None:
    """The tenant of the request's key: `Authorization: Bearer <key>` (OpenAI) or
    `x-api-key: <key>` (Anthropic), on every route; None when the server needs no key.
    Every key is compared (in constant time), so timing does not tell which one is close."""
    if not state.tenants:
        return None
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    given = (token.strip() if scheme.lower() == "bearer" else request.headers.get("x-api-key", "")).encode()
    tenant = None
    for key, name in state.tenants.items():
        if secrets.compare_digest(given, key.encode()):
            tenant = name
    if tenant is None:
        raise unauthorized("Invalid or missing API key; send 'Authorization: Bearer <key>' or 'x-api-key: <key>'")
    return tenant


def cache_namespace(tenant: str | None, cache_salt: str | None) -> Hashable:
    """The radix-cache namespace a request may share prefixes in: its tenant's (each API key
    has its own unless several share a tenant name), narrowed by its `cache_salt`. None (no
    keys, no salt) is the one shared namespace."""
    if tenant is None and cache_salt is None:
        return None
    return ("tenant", tenant, cache_salt)


class BodyLimitMiddleware:
    """Refuses a request body over `state.limits.max_body_bytes` with a 413 in its API's shape,
    by Content-Length before reading, else as the bytes arrive. Pure ASGI: the body read is
    replayed to the app, and later receives (disconnects) pass through."""

    def __init__(self, app: ASGIApp, state: ServerState, shapes: dict[str, ErrorShape]) -> None:
        self.app, self.state, self.shapes = app, state, shapes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in _BODY_METHODS:
            await self.app(scope, receive, send)
            return
        limit = self.state.limits.max_body_bytes
        declared = _content_length(scope)
        if declared is not None and declared > limit:
            await self._refuse(scope, receive, send, declared, limit)
            return
        chunks, total, more = [], 0, True
        while more:
            message = await receive()
            if message["type"] != "http.request":  # gone before the body was whole
                return
            chunks.append(message.get("body", b""))
            total += len(chunks[-1])
            more = message.get("more_body", False)
            if total > limit:
                await self._refuse(scope, receive, send, None, limit)
                return
        await self.app(scope, _replay(b"".join(chunks), receive), send)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send, size: int | None, limit: int) -> None:
        response = shaped_error(scope["path"], self.shapes, too_large(size, limit))
        response.headers["Connection"] = "close"  # the unread rest of the body is not drained
        await response(scope, receive, send)


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


def _replay(body: bytes, receive: Receive) -> Receive:
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


async def watch_engine(state: ServerState) -> None:
    """Once the engine thread is dead, stop the server with exit code 1 (streams still open
    got their 503 from the engine; new requests get one until the server is gone)."""
    while True:
        await asyncio.sleep(ENGINE_WATCH_S)
        engine: Any = state.engine
        if engine is not None and not getattr(engine, "is_alive", True):
            log.error("the engine thread died; failing requests with 503 and stopping the server")
            if state.on_fatal is not None:
                state.on_fatal(1, "engine thread died")
            return

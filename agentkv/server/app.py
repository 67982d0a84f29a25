"""The FastAPI app factory: routes, API-key check, request metrics, and the engine's life.

`create_app(engine)` takes a ready AsyncEngine, or a zero-argument callable that builds one:
then the app answers at once (GET /health is 503 "loading") while the model loads in a
background thread. Handlers never touch tensors: they translate HTTP to engine calls."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.openapi.utils import get_openapi
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from agentkv.runtime.client import EngineClient
from agentkv.server import responses as r
from agentkv.server.anthropic_responses import CountTokensResponse, MessageResponse, anthropic_error_response
from agentkv.server.anthropic_schemas import CountTokensRequest, MessagesRequest
from agentkv.server.errors import ErrorResponse, install_handlers
from agentkv.server.guard import BodyLimitMiddleware, authenticate, watch_engine
from agentkv.server.lifecycle import EngineLoader, FatalHook, ServerLimits, ServerState
from agentkv.server.responses_objects import DeletedResponse, ResponseObject
from agentkv.server.responses_schemas import ResponsesRequest
from agentkv.server.responses_store import ResponseStore
from agentkv.server.schemas import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    EmbeddingRequest,
    TokenizeRequest,
)
from agentkv.server.serving_admin import add_admin_routes, check_metrics_access
from agentkv.server.serving_chat import create_chat_completion
from agentkv.server.serving_completions import create_completion
from agentkv.server.serving_lora import add_lora_routes
from agentkv.server.serving_messages import count_tokens, create_message
from agentkv.server.serving_misc import create_embeddings, detokenize, list_models, tokenize
from agentkv.server.serving_rerank import RERANK_ENDPOINTS, add_rerank_routes
from agentkv.server.serving_responses import create_response
from agentkv.server.serving_router import ROUTER_ENDPOINTS, add_router_routes, health_response
from agentkv.server.translate import check_fields, check_model

ERRORS: dict[int | str, dict[str, Any]] = {code: {"model": ErrorResponse} for code in (400, 401, 404, 413, 429, 503)}
STREAM = {200: {"content": {"text/event-stream": {}}}}
_ENDPOINTS = {
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/embeddings",
    "/v1/models",
    "/v1/messages",
    "/v1/messages/count_tokens",
    "/v1/responses",
    "/tokenize",
    "/detokenize",
    "/health",
    "/metrics",
    "/flush_cache",
    "/reset_prefix_cache",
    *ROUTER_ENDPOINTS,
    *RERANK_ENDPOINTS,
}
# Each API answers errors in its own shape.
ERROR_SHAPES = {"/v1/messages": anthropic_error_response}


class MetricsMiddleware:
    """Counts every request by endpoint and status and times it to the last byte (streams
    included). Pure ASGI, so it never buffers a stream or hides a disconnect."""

    def __init__(self, app: ASGIApp, state: ServerState) -> None:
        self.app, self.state = app, state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start, status = time.perf_counter(), 500
        path = scope["path"]
        endpoint = path if path in _ENDPOINTS else "other"

        async def send_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            self.state.metrics.observe_request(endpoint, status, time.perf_counter() - start)


def _openapi_400s(app: FastAPI) -> dict[str, Any]:
    """FastAPI documents validation failures as 422; this server answers them with 400."""
    if app.openapi_schema is None:
        schema = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
        for path in schema.get("paths", {}).values():
            for op in path.values():
                op.get("responses", {}).pop("422", None)
        for name in ("HTTPValidationError", "ValidationError"):
            schema.get("components", {}).get("schemas", {}).pop(name, None)
        app.openapi_schema = schema
    return app.openapi_schema


async def until_disconnect(request: Request, work: Any, stream: bool | None) -> Any:
    """Run a non-streaming handler, cancelling it (which aborts its requests and frees their
    KV) if the client goes away first. Streams watch the connection themselves."""
    if stream:
        return await work
    task = asyncio.ensure_future(work)
    while True:
        done, _ = await asyncio.wait({task}, timeout=DISCONNECT_POLL_S)
        if done:
            return task.result()
        if await request.is_disconnected():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            return Response(status_code=499)


DISCONNECT_POLL_S = 0.25


def create_app(
    engine: EngineClient | EngineLoader,
    *,
    api_key: str | Mapping[str, str | None] | None = None,
    served_model_name: str | None = None,
    strict_request_fields: bool = False,
    chat_template: Any = None,
    limits: ServerLimits | None = None,
    on_fatal: FatalHook | None = None,
    runtime_lora: bool = False,
) -> FastAPI:
    """The app for `engine` (an EngineClient, or a callable that loads one in the background).
    `api_key`: one key, or keys mapped to tenant names (None: each key its own tenant); each
    tenant gets its own cache namespace. `strict_request_fields`: unknown request fields are a
    400 instead of a logged warning. `chat_template` (a ChatTemplate) replaces the model's own
    for every chat request. `on_fatal(exit_code, why)` is called once the engine is lost (it
    died, or failed to load): the host should stop serving and exit with that code.
    `runtime_lora`: serve /v1/load_lora_adapter and /v1/unload_lora_adapter (they read any
    path the server can; vLLM too keeps them off unless asked)."""
    state = ServerState(
        engine,
        api_key=api_key,
        served_model_name=served_model_name,
        strict_request_fields=strict_request_fields,
        chat_template=chat_template,
        limits=limits,
        on_fatal=on_fatal,
    )
    owns_engine = state.engine is None

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        state.start_loading()
        watch = asyncio.create_task(watch_engine(state))
        yield
        watch.cancel()
        if owns_engine and state.engine is not None:
            await state.engine.shutdown()

    app = FastAPI(
        title="agentkv", version="0.1.0", lifespan=lifespan, description="OpenAI-compatible API over an agentkv engine"
    )
    app.state.server = state
    install_handlers(app, ERROR_SHAPES)
    app.add_middleware(BodyLimitMiddleware, state=state, shapes=ERROR_SHAPES)
    app.add_middleware(MetricsMiddleware, state=state)
    app.openapi = lambda: _openapi_400s(app)  # type: ignore[method-assign]
    _add_routes(app, state, runtime_lora)
    return app


def _add_routes(app: FastAPI, state: ServerState, runtime_lora: bool = False) -> None:
    def check_key(request: Request) -> None:
        """A known key (not /health; /metrics and the flush check their own): its tenant."""
        request.state.tenant = authenticate(state, request)

    auth = [Depends(check_key)]
    _add_anthropic_routes(app, state, auth)
    _add_responses_routes(app, state, auth)
    add_router_routes(app, state, auth)
    add_admin_routes(app, state)
    add_rerank_routes(app, state, auth)
    if runtime_lora:
        add_lora_routes(app, state, auth, ERRORS)

    @app.get("/health", response_model=r.HealthResponse, responses={503: {"model": r.HealthResponse}})
    async def health() -> Any:
        return health_response(state)

    @app.get("/metrics", response_class=Response)
    async def metrics(request: Request) -> Response:
        check_metrics_access(state, request)
        return Response(state.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models", response_model=r.ModelList, responses=ERRORS, dependencies=auth)
    async def models() -> Any:
        return list_models(state)

    @app.get("/v1/models/{model_id}", response_model=r.ModelCard, responses=ERRORS, dependencies=auth)
    async def model(model_id: str) -> Any:
        check_model(state, model_id)
        cards = list_models(state).data
        return next((c for c in cards if c.id == model_id.rpartition(":")[2]), cards[0])

    @app.post(
        "/v1/chat/completions",
        response_model=r.ChatCompletionResponse,
        responses={**ERRORS, **STREAM},
        dependencies=auth,
    )
    async def chat(req: ChatCompletionRequest, request: Request) -> Any:
        check_fields(state, req, "/v1/chat/completions")
        return await until_disconnect(request, create_chat_completion(state, req, request.state.tenant), req.stream)

    @app.post("/v1/completions", response_model=r.CompletionResponse, responses={**ERRORS, **STREAM}, dependencies=auth)
    async def completions(req: CompletionRequest, request: Request) -> Any:
        check_fields(state, req, "/v1/completions")
        return await until_disconnect(request, create_completion(state, req, request.state.tenant), req.stream)

    @app.post("/v1/embeddings", response_model=r.EmbeddingResponse, responses=ERRORS, dependencies=auth)
    async def embeddings(req: EmbeddingRequest) -> Any:
        check_fields(state, req, "/v1/embeddings")
        return await create_embeddings(state, req)

    @app.post("/tokenize", response_model=r.TokenizeResponse, responses=ERRORS, dependencies=auth)
    async def tokenize_route(req: TokenizeRequest) -> Any:
        return await tokenize(state, req)

    @app.post("/detokenize", response_model=r.DetokenizeResponse, responses=ERRORS, dependencies=auth)
    async def detokenize_route(req: DetokenizeRequest) -> Any:
        return await detokenize(state, req)


def _add_anthropic_routes(app: FastAPI, state: ServerState, auth: list[Any]) -> None:
    @app.post("/v1/messages", response_model=MessageResponse, responses={**ERRORS, **STREAM}, dependencies=auth)
    async def messages(req: MessagesRequest, request: Request) -> Any:
        check_fields(state, req, "/v1/messages")
        return await until_disconnect(request, create_message(state, req, request.state.tenant), req.stream)

    @app.post("/v1/messages/count_tokens", response_model=CountTokensResponse, responses=ERRORS, dependencies=auth)
    async def messages_count_tokens(req: CountTokensRequest) -> Any:
        check_fields(state, req, "/v1/messages/count_tokens")
        return await count_tokens(state, req)


def _add_responses_routes(app: FastAPI, state: ServerState, auth: list[Any]) -> None:
    # What previous_response_id can continue, one store per tenant: no tenant reads, continues
    # or deletes another's responses.
    stores: dict[str | None, ResponseStore] = {}

    def store_of(request: Request) -> ResponseStore:
        return stores.setdefault(request.state.tenant, ResponseStore())

    @app.post("/v1/responses", response_model=ResponseObject, responses={**ERRORS, **STREAM}, dependencies=auth)
    async def responses(req: ResponsesRequest, request: Request) -> Any:
        check_fields(state, req, "/v1/responses")
        return await until_disconnect(
            request, create_response(state, store_of(request), req, request.state.tenant), req.stream
        )

    @app.get("/v1/responses/{response_id}", response_model=ResponseObject, responses=ERRORS, dependencies=auth)
    async def get_response(response_id: str, request: Request) -> Any:
        return store_of(request).require(response_id).body

    @app.delete("/v1/responses/{response_id}", response_model=DeletedResponse, responses=ERRORS, dependencies=auth)
    async def delete_response(response_id: str, request: Request) -> Any:
        store = store_of(request)
        store.require(response_id)
        store.delete(response_id)
        return DeletedResponse(id=response_id)

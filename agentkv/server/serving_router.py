"""The worker contract of SGLang's router (sglang-router 0.3.x, "SGLang Model Gateway"): the
routes it reads to register, watch and balance a worker, so agentkv replicas sit behind it
without an adapter.

What the router does with each route (facts read from its 0.3.2 source):
- `/health`: registration and the periodic health check; 2xx only when ready (app.py).
- `/server_info` (falls back to `/get_server_info` on a 404) and `/model_info` (falls back
  to `/get_model_info`): read once at registration into worker labels (model_path,
  served_model_name, tp_size, dp_size; model_type, architectures).
- `/get_load`: a JSON array, one entry per data-parallel rank, of
  `{dp_rank, num_reqs, num_waiting_reqs, num_tokens}`; the router sums `num_tokens` as the
  worker's load (shown by the router's `/get_loads`, used by load-aware policies).
- `/health_generate`: the router's own `/health_generate` forwards here; it proves the model
  can produce a token, not only that the process is up.
Everything else it forwards (`/v1/chat/completions`, `/v1/completions`, `/v1/embeddings`,
`/v1/models`, `/metrics` for its `/engine_metrics`) is the ordinary API."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.responses import JSONResponse

from agentkv.runtime.params import SamplingParams
from agentkv.server.lifecycle import ServerState
from agentkv.server.responses import HealthResponse

HEALTH_GENERATE_PROMPT = "ping"
ROUTER_ENDPOINTS = (
    "/server_info",
    "/get_server_info",
    "/model_info",
    "/get_model_info",
    "/get_load",
    "/health_generate",
)


def health_response(state: ServerState) -> Any:
    """GET /health: 200 only while the engine can serve; 503 while it loads, when it failed
    to load, and once its loop has died (a router must stop sending to it)."""
    if state.engine_alive:
        return HealthResponse(status="ok", model=state.model_name)
    if state.engine is not None:
        body = HealthResponse(status="failed", detail="the engine thread died")
    else:
        body = HealthResponse(status="failed" if state.load_error else "loading", detail=state.load_error)
    return JSONResponse(body.model_dump(), status_code=503)


def server_info(state: ServerState) -> dict[str, Any]:
    """The fields the router reads from `/server_info`: one replica, no tensor or data
    parallelism inside it, no prefill/decode disaggregation."""
    engine = state.require_engine()
    return {
        "model_path": engine.model_name,
        "served_model_name": state.model_name,
        "tp_size": 1,
        "dp_size": 1,
        "disaggregation_mode": "null",
        "max_total_tokens": engine.max_model_len,
        "version": _version(),
        "engine": "agentkv",
    }


def model_info(state: ServerState) -> dict[str, Any]:
    engine = state.require_engine()
    return {
        "model_path": engine.model_name,
        "tokenizer_path": engine.model_name,
        "is_generation": not engine.is_embedding,
        "max_model_len": engine.max_model_len,
    }


def load(state: ServerState) -> list[dict[str, int]]:
    """One rank's load. `num_tokens` counts the KV tokens held by live requests: used blocks
    minus those only the prefix cache holds (they are evictable, so not load)."""
    engine = state.require_engine()
    stats = engine.stats()
    live_blocks = max(0, stats.kv_blocks_used - stats.kv_blocks_cached)
    return [
        {
            "dp_rank": 0,
            "num_reqs": stats.num_running + stats.num_waiting,
            "num_waiting_reqs": stats.num_waiting,
            "num_tokens": live_blocks * _block_size(engine),
        }
    ]


async def health_generate(state: ServerState) -> JSONResponse:
    """200 once the engine has produced one greedy token; 503 with the cause otherwise."""
    engine = state.require_engine()
    ids = engine.tokenizer.encode(HEALTH_GENERATE_PROMPT, True)
    last = None
    async for out in engine.generate(None, ids, SamplingParams(max_tokens=1, temperature=0.0)):
        last = out
    if last is None or last.finish_reason == "error":
        detail = last.error if last is not None else "no output"
        return JSONResponse({"status": "failed", "detail": detail}, status_code=503)
    return JSONResponse({"status": "ok", "model": state.model_name})


def add_router_routes(app: FastAPI, state: ServerState, auth: list[Any]) -> None:
    """Register the router's worker routes on `app` (mutates it). The router sends the
    worker's API key as a bearer token, so they take the same key check as the API."""
    for path in ROUTER_ENDPOINTS[:2]:
        app.add_api_route(path, lambda: server_info(state), methods=["GET"], dependencies=auth)
    for path in ROUTER_ENDPOINTS[2:4]:
        app.add_api_route(path, lambda: model_info(state), methods=["GET"], dependencies=auth)
    app.add_api_route("/get_load", lambda: load(state), methods=["GET"], dependencies=auth)

    async def health_generate_route() -> JSONResponse:
        return await health_generate(state)

    app.add_api_route("/health_generate", health_generate_route, methods=["GET"], dependencies=auth)


def _block_size(engine: Any) -> int:
    """Tokens per KV block: the engine's cache config where the engine has one (AsyncEngine
    does; the EngineClient protocol does not promise it), else 1 (load counted in blocks)."""
    config = getattr(engine, "config", None)
    cache = getattr(config, "cache", None)
    return int(getattr(cache, "block_size", 1))


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("agentkv")
    except PackageNotFoundError:
        return "0+unknown"

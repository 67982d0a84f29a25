"""Live servers for the API tests: uvicorn in a background thread on a free 127.0.0.1 port,
driven over real HTTP. One smollm2 engine is shared by every server in the session."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any, NamedTuple

import httpx
import openai
import pytest
import uvicorn

from agentkv.commands.ports import free_port
from agentkv.runtime.async_engine import AsyncEngine
from agentkv.server.app import create_app

API_KEY = "test-key"


class LiveServer(NamedTuple):
    base_url: str
    engine: Any
    app: Any


def start_server(app: Any, *, wait_ready: bool = True) -> tuple[uvicorn.Server, str]:
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    threading.Thread(target=server.run, daemon=True).start()
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        try:
            status = httpx.get(f"{base}/health", timeout=5).status_code
            if status == 200 or (status == 503 and not wait_ready):
                return server, base
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"server at {base} did not become ready")


def serve(app: Any, engine: Any, **kw: Any) -> Iterator[LiveServer]:
    server, base = start_server(app, **kw)
    yield LiveServer(base, engine, app)
    server.should_exit = True


@pytest.fixture(scope="session")
def smollm2_engine() -> AsyncEngine:
    engine = AsyncEngine.from_model("smollm2", max_model_len=1024, kv_cache_blocks=512)
    engine.start()
    return engine


@pytest.fixture(scope="session")
def smollm2_server(smollm2_engine) -> Iterator[LiveServer]:
    yield from serve(create_app(smollm2_engine, served_model_name="smollm2"), smollm2_engine)


@pytest.fixture(scope="session")
def keyed_server(smollm2_engine) -> Iterator[LiveServer]:
    yield from serve(create_app(smollm2_engine, api_key=API_KEY, served_model_name="smollm2"), smollm2_engine)


@pytest.fixture(scope="session")
def strict_server(smollm2_engine) -> Iterator[LiveServer]:
    yield from serve(
        create_app(smollm2_engine, served_model_name="smollm2", strict_request_fields=True), smollm2_engine
    )


@pytest.fixture(scope="session")
def minilm_server() -> Iterator[LiveServer]:
    engine = AsyncEngine.from_model("minilm")
    yield from serve(create_app(engine, served_model_name="minilm"), engine)


def make_client(server: LiveServer, api_key: str = "unused") -> openai.OpenAI:
    return openai.OpenAI(
        base_url=f"{server.base_url}/v1", api_key=api_key, max_retries=0, timeout=300, _strict_response_validation=True
    )


@pytest.fixture(scope="session")
def client(smollm2_server) -> openai.OpenAI:
    return make_client(smollm2_server)


@pytest.fixture(scope="session")
def http(smollm2_server) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=smollm2_server.base_url, timeout=300) as c:
        yield c


@pytest.fixture(scope="session")
def server_tools() -> Any:
    """The helpers, for tests that start their own server or client."""

    class Tools:
        start = staticmethod(start_server)
        client = staticmethod(make_client)

    return Tools

"""The cluster's front door: forwards every request to the router unchanged, except that a chat
or completions request naming a LoRA adapter gets the adapter's routing tag in its text
(server/route_tag.py), so the router's cache-aware trees keep each adapter's prefixes apart
from the base's and every other adapter's; the worker takes the tag out again.

    agentkv cluster --replicas 2 --front-port 29999 --lora-modules a=/path/a MODEL

Which names are bases it reads once from the router's /v1/models (cards without a `parent`);
any other `model` (`adapter`, or SGLang's `base:adapter`) is an adapter. Responses stream
through as they arrive."""

from __future__ import annotations

import argparse
import contextlib
import json
from typing import Any

TAGGED = ("/v1/chat/completions", "/v1/completions")
_HOP = {"host", "content-length", "transfer-encoding", "connection", "content-encoding"}


def adapter_named(model: Any, bases: set[str]) -> str | None:
    """The adapter a request's `model` names, or None for the base (or no model)."""
    if not isinstance(model, str) or model in bases:
        return None
    base, sep, rest = model.partition(":")
    return rest if sep and base in bases else model


def front_app(router_url: str) -> Any:
    """The ASGI app that forwards to `router_url`, tagging adapter requests."""
    import httpx
    from starlette.applications import Starlette
    from starlette.background import BackgroundTask
    from starlette.requests import Request
    from starlette.responses import StreamingResponse
    from starlette.routing import Route

    client = httpx.AsyncClient(base_url=router_url, timeout=None)
    bases: set[str] = set()

    async def base_names() -> set[str]:
        if not bases:
            cards = (await client.get("/v1/models")).json().get("data", [])
            bases.update(c["id"] for c in cards if not c.get("parent"))
        return bases

    async def forward(request: Request) -> StreamingResponse:
        body = await request.body()
        if request.method == "POST" and request.url.path in TAGGED:
            body = await _tagged(body, base_names)
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP}
        upstream = client.build_request(
            request.method, request.url.path, params=request.query_params, headers=headers, content=body
        )
        resp = await client.send(upstream, stream=True)
        out = {k: v for k, v in resp.headers.items() if k.lower() not in _HOP}
        return StreamingResponse(resp.aiter_raw(), resp.status_code, out, background=BackgroundTask(resp.aclose))

    @contextlib.asynccontextmanager
    async def lifespan(_app: Any):
        yield
        await client.aclose()

    methods = ["GET", "POST", "PUT", "DELETE", "PATCH"]
    return Starlette(routes=[Route("/{path:path}", forward, methods=methods)], lifespan=lifespan)


async def _tagged(body: bytes, base_names) -> bytes:
    """A JSON request body with its adapter's routing tag (as it came when not JSON or base)."""
    from agentkv.server.route_tag import tag_request

    try:
        data = json.loads(body)
    except ValueError:
        return body
    if not isinstance(data, dict):
        return body
    adapter = adapter_named(data.get("model"), await base_names())
    return body if adapter is None else json.dumps(tag_request(data, adapter)).encode()


def main(argv: list[str] | None = None) -> None:
    """`python -m agentkv.commands.cluster_front --router URL --host H --port P`."""
    import uvicorn

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--router", required=True, help="the router's URL")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args(argv)
    uvicorn.run(front_app(args.router), host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()

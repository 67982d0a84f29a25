"""Server-sent events for streamed completions. The request is admitted (validated, queued)
before the 200 goes out; then the headers go at once, `: keep-alive` comments fill any quiet
interval (a request still queued, a long prefill), and a client that goes away — mid-stream
or still queued — is noticed at once, so its engine requests are aborted and their KV blocks
freed before any prefill is spent on them."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from functools import partial
from typing import Any

import anyio
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from agentkv.server.errors import APIError, error_body

log = logging.getLogger("agentkv.server")


class AbortingStreamingResponse(StreamingResponse):
    """A StreamingResponse that always watches for the client's disconnect (whatever ASGI
    version the server speaks) and always runs `on_close` — finished, failed or cut off."""

    def __init__(self, content: AsyncIterator[str], on_close: Callable[[], Awaitable[None]]) -> None:
        super().__init__(
            content, media_type="text/event-stream", headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
        )
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            async with anyio.create_task_group() as group:

                async def run_then_cancel(func: Callable[[], Awaitable[None]]) -> None:
                    await func()
                    group.cancel_scope.cancel()

                group.start_soon(run_then_cancel, partial(self.stream_response, send))
                await run_then_cancel(partial(self.listen_for_disconnect, receive))
        except OSError:
            log.info("client went away mid-stream")
        finally:
            with anyio.CancelScope(shield=True):
                await self._on_close()


def sse(payload: str) -> str:
    return f"data: {payload}\n\n"


async def _events(chunks: AsyncIterator[str]) -> AsyncIterator[str]:
    """Payloads as SSE events, `[DONE]` last. An error after the 200 is sent as an error event
    (the status line is gone); the stream still ends cleanly."""
    try:
        async for payload in chunks:
            yield sse(payload)
    except APIError as exc:
        yield sse(json.dumps(error_body(exc.message, type=exc.type, param=exc.param, code=exc.code)))
    except Exception as exc:  # a bug: logged with its trace, and the client told
        log.exception("stream failed")
        yield sse(json.dumps(error_body(f"Internal server error: {type(exc).__name__}", type="internal_server_error")))
    yield sse("[DONE]")


async def _named_events(chunks: AsyncIterator[str]) -> AsyncIterator[str]:
    """Anthropic framing: `chunks` are whole named events already; an error after the 200
    is an `error` event, and there is no `[DONE]`."""
    from agentkv.server.anthropic_responses import anthropic_error_body

    try:
        async for frame in chunks:
            yield frame
    except APIError as exc:
        yield _error_event(anthropic_error_body(exc.status, exc.message))
    except Exception as exc:  # a bug: logged with its trace, and the client told
        log.exception("stream failed")
        yield _error_event(anthropic_error_body(500, f"Internal server error: {type(exc).__name__}"))


def _error_event(body: dict[str, Any]) -> str:
    return f"event: error\ndata: {json.dumps(body)}\n\n"


KEEPALIVE = ": keep-alive\n\n"  # an SSE comment: every client's parser skips it
_END = object()


async def with_keepalive(frames: AsyncIterator[str], interval_s: float | None) -> AsyncIterator[str]:
    """`frames`, with a KEEPALIVE whenever `interval_s` passes without one (None: never).
    `frames` runs in a task of its own, so waiting on it is never cut short mid-frame."""
    if not interval_s:
        async for frame in frames:
            yield frame
        return
    q: asyncio.Queue[Any] = asyncio.Queue(maxsize=8)

    async def produce() -> None:
        async for frame in frames:
            await q.put(frame)
        await q.put(_END)

    task = asyncio.create_task(produce())
    try:
        while True:
            try:
                frame = await asyncio.wait_for(q.get(), interval_s)
            except TimeoutError:
                if task.done() and q.empty():
                    task.result()  # a producer that died without its end: raise its error
                    return
                yield KEEPALIVE
                continue
            if frame is _END:
                return
            yield frame
    finally:
        task.cancel()


async def sse_response(
    streams: Any,
    make_chunks: Callable[[], AsyncIterator[str]],
    *,
    named_events: bool = False,
    keepalive_s: float | None = None,
) -> StreamingResponse:
    """Admit `streams` (a ChoiceStreams) — refusals surface here as APIError, before any byte
    is sent — then stream `make_chunks()` at once: JSON payloads framed as `data:` events, or
    (`named_events`) whole named events, with keep-alive comments every `keepalive_s`."""
    await streams.__aenter__()
    frames = _named_events if named_events else _events
    return AbortingStreamingResponse(with_keepalive(frames(make_chunks()), keepalive_s), streams.close)

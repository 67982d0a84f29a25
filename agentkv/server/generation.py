"""Driving the engine for one HTTP request: several engine requests (n choices, batched
prompts) run concurrently and merge into one stream of (choice index, output); whatever way
the consumer leaves — finished, error, client gone — unfinished requests are aborted at once,
so their KV blocks return to the pool."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Hashable
from dataclasses import dataclass
from typing import Any

import anyio

from agentkv.runtime.client import EngineClient
from agentkv.server.lifecycle import ServerState
from agentkv.server.metrics import TokenTimer
from agentkv.server.translate import engine_error, request_failed

_DONE = object()


@dataclass(slots=True)
class Job:
    """One engine request: the choice it answers, what to generate, and the cache namespace
    it may share prefixes in (its tenant and cache_salt)."""

    index: int
    request_id: str
    prompt_ids: list[int]
    params: Any
    constraint: Any = None
    namespace: Hashable = None


class ChoiceStreams:
    """Async iterator over (index, RequestOutput) for `jobs`; use with `async with`.

    Entering admits every job at once (the engine's checks, its queue bound, its death all
    surface there as APIError, before a caller commits to a 200); a job the engine refuses
    takes the others down with it."""

    def __init__(self, state: ServerState, engine: EngineClient, jobs: list[Job]) -> None:
        self._state, self._engine, self._jobs = state, engine, jobs
        # Bounded: a consumer that stops reading (a client that stopped reading its socket)
        # stops the pumps, and each request's stream then merges what it has not read.
        self._queue: asyncio.Queue[Any] = asyncio.Queue(maxsize=len(jobs))
        self._tasks: list[asyncio.Task[None]] = []
        self._streams: list[Any] = []
        self._pending = len(jobs)
        start = time.perf_counter()
        self._timers = [TokenTimer(state.metrics, start) for _ in jobs]
        self._by_index = {job.index: pos for pos, job in enumerate(jobs)}

    async def __aenter__(self) -> ChoiceStreams:
        try:
            for job in self._jobs:
                self._streams.append(
                    self._engine.generate(
                        job.request_id, job.prompt_ids, job.params, constraint=job.constraint, namespace=job.namespace
                    )
                )
        except Exception as exc:
            await self.close()
            raise engine_error(exc) from exc
        self._tasks = [asyncio.create_task(self._pump(job, stream)) for job, stream in zip(self._jobs, self._streams)]
        return self

    async def __aexit__(self, *exc: Any) -> None:
        with anyio.CancelScope(shield=True):
            await self.close()

    async def close(self) -> None:
        """Abort what is still running (idempotent: a finished stream ignores it)."""
        for task in self._tasks:
            task.cancel()
        for stream in self._streams:
            await stream.aclose()

    async def _pump(self, job: Job, stream: Any) -> None:
        try:
            async for out in stream:
                await self._queue.put((job.index, out))
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # handed to the consumer, which maps or re-raises it
            await self._queue.put(exc)
            return
        await self._queue.put(_DONE)

    def __aiter__(self) -> AsyncIterator[tuple[int, Any]]:
        return self

    async def __anext__(self) -> tuple[int, Any]:
        while self._pending:
            item = await self._queue.get()
            if item is _DONE:
                self._pending -= 1
                continue
            if isinstance(item, Exception):
                raise engine_error(item) from item
            index, out = item
            if out.finish_reason == "error":  # this request alone failed inside the engine
                raise request_failed(out.error or "unknown error")
            self._record(index, out)
            return index, out
        raise StopAsyncIteration

    def _record(self, index: int, out: Any) -> None:
        self._timers[self._by_index[index]].tokens(time.perf_counter(), len(out.token_ids))
        if out.finished:
            self._state.metrics.observe_generation(out.prompt_len, out.cached_len, out.num_tokens, out.finish_reason)


async def collect(streams: ChoiceStreams) -> dict[int, Any]:
    """Run to the end; per choice, all of its outputs merged (the whole text, ids, logprobs)."""
    merged: dict[int, Any] = {}
    async for index, out in streams:
        if index in merged:
            merged[index].merge(out)
        else:
            merged[index] = out
    return merged

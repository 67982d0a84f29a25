"""One request's outputs on the event loop: what the engine thread delivered and the reader
has not taken yet, merged into one output, so a stream holds O(its output) however far its
reader falls behind; and the bound after which a reader that stopped reading loses it.

    engine thread --deliver(output)--> loop.call_soon_threadsafe(Collector.put)
                                          pending = pending.merge(output)   (never a queue)
    reader: await RequestStream.__anext__() --> Collector.get(): the merged pending output
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from agentkv.runtime.errors import StreamStalledError
from agentkv.runtime.outputs import RequestOutput


class Collector:
    """What the reader has not taken yet (event loop only): one merged output, then at most
    one error. `stall_s`: once an output has waited longer than that unread, the request is
    ended (`on_stall` aborts it in the engine) and the reader gets StreamStalledError."""

    __slots__ = ("_output", "_error", "_ready", "_since", "stall_s", "_on_stall", "_now")

    def __init__(self, stall_s: float | None, on_stall: Callable[[], None], now=time.monotonic) -> None:
        self._output: RequestOutput | None = None
        self._error: BaseException | None = None
        self._ready = asyncio.Event()
        self._since = 0.0  # when the pending output became pending
        self.stall_s, self._on_stall, self._now = stall_s, on_stall, now

    def put(self, item: RequestOutput | BaseException) -> None:
        if self._error is not None:
            return  # the stream has ended with an error; later news is moot
        if isinstance(item, BaseException):
            self._error = item
        elif self._output is None:
            self._output, self._since = item, self._now()
        else:
            self._output.merge(item)
            if self.stall_s is not None and not item.finished and self._now() - self._since > self.stall_s:
                self._error = StreamStalledError(self.stall_s)
                self._output = None
                self._on_stall()
        self._ready.set()

    async def get(self) -> RequestOutput | BaseException:
        while self._output is None and self._error is None:
            self._ready.clear()
            await self._ready.wait()
        if self._output is not None:
            out, self._output = self._output, None
            return out
        return self._error  # type: ignore[return-value]

    @property
    def num_pending_chars(self) -> int:
        """Characters of text held for the reader (what a stalled stream costs in memory)."""
        return len(self._output.text) if self._output is not None else 0


class RequestStream:
    """One admitted request's outputs, as an async iterator (event loop only). Leaving early
    — `aclose()`, a cancelled `__anext__`, or the stream being dropped — calls `release`
    with finished=False, which aborts the request and frees its KV."""

    def __init__(self, release: Callable[[str, bool], None], request_id: str, collector: Collector) -> None:
        self.request_id = request_id
        self._release, self._collector = release, collector
        self._done = False

    def __aiter__(self) -> RequestStream:
        return self

    async def __anext__(self) -> RequestOutput:
        if self._done:
            raise StopAsyncIteration
        try:
            item = await self._collector.get()
        except BaseException:  # cancelled while waiting: the caller left
            self._end(finished=False)
            raise
        if isinstance(item, BaseException):
            self._end(finished=True)  # the engine refused or lost it (or ended it): nothing to abort
            raise item
        if item.finished:
            self._end(finished=True)
        return item

    async def aclose(self) -> None:
        self._end(finished=False)

    def _end(self, finished: bool) -> None:
        if not self._done:
            self._done = True
            self._release(self.request_id, finished)

    def __del__(self) -> None:
        if not self._done:
            self._end(finished=False)

"""`AsyncEngine`: the engine stepping in its own thread, streaming to asyncio consumers.

HTTP handlers never run the model: they queue commands (add, abort) that the engine thread
applies between steps, and read outputs from per-request asyncio queues.

    event loop ──add/abort──► inbox ──► engine thread: apply, step(), step(), ...
        ▲                                        │
        └──── loop.call_soon_threadsafe(queue.put_nowait, output) ◄──┘
"""
from __future__ import annotations

import asyncio
import logging
import queue
import threading
import uuid
from typing import Any, AsyncIterator, Hashable

import numpy as np

from agentkv.formats.generation_config import read_generation_config
from agentkv.runtime.config import CacheConfig, EngineConfig
from agentkv.runtime.engine import Engine
from agentkv.runtime.errors import EngineDeadError
from agentkv.runtime.outputs import EngineStats, RequestOutput
from agentkv.runtime.params import SamplingParams

log = logging.getLogger(__name__)


class AsyncEngine:
    def __init__(self, engine: Engine):
        self.engine = engine
        self.tokenizer = engine.tokenizer
        self.chat_template = engine.chat_template
        self.model_name = engine.model_name
        self.max_model_len = engine.max_model_len
        self.vocab_size = engine.vocab_size
        self.is_embedding = engine.is_embedding
        self.generation_config = read_generation_config(engine.source.path)  # {} for GGUF
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._wake = threading.Event()
        self._streams: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue]] = {}
        self._thread: threading.Thread | None = None
        self._stop = False
        self._dead: BaseException | None = None
        self._embed_lock = threading.Lock()

    @classmethod
    def from_model(cls, model: str, *, backend: str = "torch", max_model_len: int | None = None,
                   kv_cache_blocks: int | None = None, kv_cache_memory: int | None = None,
                   enable_prefix_cache: bool = True, weights: str = "resident",
                   served_model_name: str | None = None, block_size: int = 16) -> AsyncEngine:
        """Load a model (blocking: call it from a thread when an event loop is running)."""
        cache = CacheConfig(block_size=block_size, num_blocks=kv_cache_blocks,
                            memory_bytes=kv_cache_memory, enable_prefix_cache=enable_prefix_cache)
        config = EngineConfig(model=model, backend=backend, weights=weights,
                              max_model_len=max_model_len, cache=cache,
                              served_model_name=served_model_name)
        return cls(Engine(config))

    # -- lifecycle ------------------------------------------------------------------------
    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="agentkv-engine", daemon=True)
            self._thread.start()

    async def shutdown(self) -> None:
        self._stop = True
        self._wake.set()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join, 10)

    @property
    def is_alive(self) -> bool:
        return self._dead is None

    # -- requests -------------------------------------------------------------------------
    async def generate(self, request_id: str | None, prompt_ids: list[int], params: SamplingParams,
                       *, constraint: Any = None, namespace: Hashable = None,
                       index: int = 0) -> AsyncIterator[RequestOutput]:
        """Stream a request's outputs; the last one has `finished`. Raises ValueError subclasses
        for bad input before anything is queued. Cancelling the iteration aborts the request."""
        if self._dead is not None:
            raise EngineDeadError(f"engine stopped: {self._dead!r}")
        self.engine.validate(prompt_ids, params)
        rid = request_id or uuid.uuid4().hex
        if rid in self._streams:
            raise ValueError(f"request id {rid!r} is already in use")
        q: asyncio.Queue = asyncio.Queue()
        self._streams[rid] = (asyncio.get_running_loop(), q)
        self._send(("add", rid, list(prompt_ids), params, constraint, namespace, index))
        finished = False
        try:
            while not finished:
                item = await q.get()
                if isinstance(item, BaseException):
                    raise item
                finished = item.finished
                yield item
        finally:
            self._streams.pop(rid, None)
            if not finished:
                self._send(("abort", rid))

    async def abort(self, request_id: str) -> None:
        self._send(("abort", request_id))

    async def pin_prefix(self, token_ids: list[int], namespace: Hashable = None,
                         ttl_s: float = 300.0) -> int:
        """Engine.pin_prefix, applied by the engine thread between steps."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[int] = loop.create_future()
        self._send(("pin", list(token_ids), namespace, ttl_s, loop, done))
        return await done

    async def embed(self, batch: list[list[int]]) -> list[list[float]]:
        if not self.is_embedding:
            raise ValueError(f"model {self.model_name!r} is not an embedding model")
        for ids in batch:
            if not ids:
                raise ValueError("each input must contain at least one token")
            if len(ids) > self.max_model_len:
                from agentkv.runtime.errors import PromptTooLongError

                raise PromptTooLongError(len(ids), self.max_model_len)

        def run() -> list[list[float]]:
            with self._embed_lock:
                return np.asarray(self.engine.model.embed(batch), dtype=np.float32).tolist()

        return await asyncio.to_thread(run)

    def stats(self) -> EngineStats:
        return self.engine.stats()

    # -- the engine thread ----------------------------------------------------------------
    def _send(self, command: tuple) -> None:
        self._inbox.put(command)
        self._wake.set()

    def _deliver(self, rid: str, item) -> None:
        target = self._streams.get(rid)
        if target is not None:
            loop, q = target
            loop.call_soon_threadsafe(q.put_nowait, item)

    def _apply(self) -> None:
        while True:
            try:
                cmd = self._inbox.get_nowait()
            except queue.Empty:
                return
            if cmd[0] == "add":
                _, rid, ids, params, constraint, namespace, index = cmd
                try:
                    self.engine.add_request(rid, ids, params, constraint, namespace, index)
                except ValueError as e:
                    self._deliver(rid, e)
            elif cmd[0] == "pin":
                _, ids, namespace, ttl_s, loop, done = cmd
                try:
                    loop.call_soon_threadsafe(done.set_result, self.engine.pin_prefix(ids, namespace, ttl_s))
                except ValueError as e:
                    loop.call_soon_threadsafe(done.set_exception, e)
            elif cmd[0] == "abort":
                out = self.engine.abort(cmd[1])
                if out is not None:
                    self._deliver(cmd[1], out)

    def _loop(self) -> None:
        try:
            while not self._stop:
                self._apply()
                if not self.engine.has_unfinished():
                    self._wake.wait(0.5)
                    self._wake.clear()
                    continue
                for out in self.engine.step():
                    self._deliver(out.request_id, out)
        except BaseException as e:  # noqa: BLE001 — reported to every waiting stream
            log.exception("engine thread died")
            self._dead = e
            for rid in list(self._streams):
                self._deliver(rid, EngineDeadError(f"engine stopped: {e!r}"))

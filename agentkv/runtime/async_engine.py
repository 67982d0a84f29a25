"""`AsyncEngine`: the engine stepping in its own thread, streaming to asyncio consumers.

HTTP handlers never run the model: they queue typed messages (AddRequest, AbortRequest,
PinPrefix, Shutdown) that the engine thread applies between steps, and read outputs from per-request
asyncio queues.

    event loop ──AddRequest/AbortRequest/Shutdown──► inbox ──► engine thread: apply, step(), ...
        ▲                                                            │
        └──────── loop.call_soon_threadsafe(queue.put_nowait, output) ◄┘
"""
from __future__ import annotations

import asyncio
import logging
import queue
import threading
import uuid
from dataclasses import dataclass
from typing import Any, AsyncIterator, Hashable

import numpy as np

from agentkv.formats.generation_config import read_generation_config
from agentkv.runtime.config import EngineConfig, engine_config
from agentkv.runtime.engine import Engine
from agentkv.runtime.errors import EngineDeadError
from agentkv.runtime.outputs import EngineStats, RequestOutput
from agentkv.runtime.params import SamplingParams

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class AddRequest:
    """Queue a request; a ValueError from the engine goes back to the request's stream."""

    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    constraint: Any = None
    namespace: Hashable = None
    index: int = 0


@dataclass(frozen=True, slots=True)
class AbortRequest:
    """Stop a request and free its KV; unknown or finished ids are ignored (a race, not a bug)."""

    request_id: str


@dataclass(frozen=True, slots=True)
class Shutdown:
    """Stop the engine thread after the messages queued before it."""


@dataclass(frozen=True, slots=True)
class PinPrefix:
    """Keep the cached prefix of `token_ids` from eviction for `ttl_s`; the pinned length (or
    the engine's ValueError) is set on `done`, a future of `loop`."""

    token_ids: list[int]
    namespace: Hashable
    ttl_s: float
    loop: asyncio.AbstractEventLoop
    done: asyncio.Future


EngineMessage = AddRequest | AbortRequest | PinPrefix | Shutdown


class AsyncEngine:
    """Satisfies `agentkv.runtime.client.EngineClient`, the interface the server depends on."""

    def __init__(self, engine: Engine):
        self.engine = engine
        self.config = engine.config
        self.tokenizer = engine.tokenizer
        self.chat_template = engine.chat_template
        self.model_name = engine.model_name
        self.max_model_len = engine.max_model_len
        self.vocab_size = engine.vocab_size
        self.is_embedding = engine.is_embedding
        self.generation_config = read_generation_config(engine.source.path)  # {} for GGUF
        self._inbox: queue.SimpleQueue[EngineMessage] = queue.SimpleQueue()
        self._wake = threading.Event()
        self._streams: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue]] = {}
        self._thread: threading.Thread | None = None
        self._stop = False
        self._dead: BaseException | None = None
        self._embed_lock = threading.Lock()

    @classmethod
    def from_config(cls, config: EngineConfig) -> AsyncEngine:
        """Load the model `config` names (blocking: call it from a thread when an event loop
        is running)."""
        if not isinstance(config, EngineConfig):
            raise TypeError(f"from_config needs an EngineConfig, got {type(config).__name__}")
        return cls(Engine(config))

    @classmethod
    def from_model(cls, model: str | EngineConfig, **overrides: Any) -> AsyncEngine:
        """`from_config(engine_config(model, **overrides))`: the same keywords as `LLM(...)`."""
        return cls.from_config(engine_config(model, **overrides))

    # -- lifecycle ------------------------------------------------------------------------
    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="agentkv-engine", daemon=True)
            self._thread.start()

    async def shutdown(self) -> None:
        self._send(Shutdown())
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
        self._send(AddRequest(rid, list(prompt_ids), params, constraint, namespace, index))
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
                self._send(AbortRequest(rid))

    async def abort(self, request_id: str) -> None:
        self._send(AbortRequest(request_id))

    async def pin_prefix(self, token_ids: list[int], namespace: Hashable = None,
                         ttl_s: float = 300.0) -> int:
        """Engine.pin_prefix, applied by the engine thread between steps."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[int] = loop.create_future()
        self._send(PinPrefix(list(token_ids), namespace, ttl_s, loop, done))
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
    def _send(self, message: EngineMessage) -> None:
        self._inbox.put(message)
        self._wake.set()

    def _deliver(self, rid: str, item) -> None:
        target = self._streams.get(rid)
        if target is not None:
            loop, q = target
            loop.call_soon_threadsafe(q.put_nowait, item)

    def _apply(self) -> None:
        """Apply every queued message (engine thread only). An unknown message is a bug: it
        raises, which ends the thread and fails every waiting stream, rather than vanishing."""
        while True:
            try:
                message = self._inbox.get_nowait()
            except queue.Empty:
                return
            match message:
                case AddRequest():
                    self._add(message)
                case AbortRequest(request_id=rid):
                    out = self.engine.abort(rid)
                    if out is not None:
                        self._deliver(rid, out)
                case PinPrefix():
                    self._pin(message)
                case Shutdown():
                    self._stop = True
                    return
                case _:
                    raise RuntimeError(f"unknown engine message {message!r} (a bug)")

    def _add(self, m: AddRequest) -> None:
        try:
            self.engine.add_request(m.request_id, m.prompt_ids, m.params, m.constraint,
                                    m.namespace, m.index)
        except ValueError as e:
            self._deliver(m.request_id, e)

    def _pin(self, m: PinPrefix) -> None:
        try:
            pinned = self.engine.pin_prefix(m.token_ids, m.namespace, m.ttl_s)
        except ValueError as e:
            m.loop.call_soon_threadsafe(m.done.set_exception, e)
        else:
            m.loop.call_soon_threadsafe(m.done.set_result, pinned)

    def _loop(self) -> None:
        try:
            while True:
                self._apply()
                if self._stop:
                    self.engine.close()  # flush the KV disk tier's pending writes
                    return
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

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
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any

import numpy as np

from agentkv.formats.generation_config import read_generation_config
from agentkv.runtime.config import EngineConfig, engine_config
from agentkv.runtime.engine import ALL_TENANTS, Engine
from agentkv.runtime.errors import EngineDeadError, QueueFullError
from agentkv.runtime.kv_disk import CLOSE_BOUND_S
from agentkv.runtime.outputs import EngineStats
from agentkv.runtime.params import SamplingParams
from agentkv.runtime.rerank import traits_of
from agentkv.runtime.streams import Collector, RequestStream

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
class FlushCache:
    """Drop one tenant's cached KV (a `kv_disk.tenant_of` group), or all with ALL_TENANTS;
    the RAM blocks freed are set on `done`, a future of `loop`."""

    tenant: object
    loop: asyncio.AbstractEventLoop
    done: asyncio.Future


@dataclass(frozen=True, slots=True)
class PinPrefix:
    """Keep the cached prefix of `token_ids` from eviction for `ttl_s`; the pinned length (or
    the engine's ValueError) is set on `done`, a future of `loop`."""

    token_ids: list[int]
    namespace: Hashable
    ttl_s: float
    loop: asyncio.AbstractEventLoop
    done: asyncio.Future


EngineMessage = AddRequest | AbortRequest | PinPrefix | FlushCache | Shutdown


def _served_len(engine: Engine) -> int:
    """The context the front end offers: the model's, clamped to what the KV pool holds (one
    sequence), so a request with no max_tokens fits the pool instead of being refused. The
    engine already refused an explicit --max-model-len the pool cannot hold."""
    capacity = engine.num_blocks * engine.block_size
    if capacity >= engine.max_model_len:
        return engine.max_model_len
    log.warning(
        "max_model_len clamped to %d tokens (from %d): the KV pool holds %d blocks x %d "
        "tokens; raise --kv-cache-blocks / --kv-cache-memory for longer sequences",
        capacity,
        engine.max_model_len,
        engine.num_blocks,
        engine.block_size,
    )
    return capacity


class AsyncEngine:
    """Satisfies `agentkv.runtime.client.EngineClient`, the interface the server depends on."""

    def __init__(self, engine: Engine):
        self.engine = engine
        self.config = engine.config
        self.tokenizer = engine.tokenizer
        self.chat_template = engine.chat_template
        self.model_name = engine.model_name
        self.max_model_len = _served_len(engine)
        self.vocab_size = engine.vocab_size
        self.is_embedding = engine.is_embedding
        self.traits = traits_of(engine.model)
        self.adapters = None if engine.is_embedding else engine.adapters  # LoRA (runtime/adapters.py)
        self.generation_config = read_generation_config(engine.source.path)  # {} for GGUF
        self._inbox: queue.SimpleQueue[EngineMessage] = queue.SimpleQueue()
        self._wake = threading.Event()
        self._streams: dict[str, tuple[asyncio.AbstractEventLoop, Collector]] = {}
        self._thread: threading.Thread | None = None
        self._stop = False
        self._dead: BaseException | None = None
        self._streams_lock = threading.RLock()  # re-entrant: a dropped stream may be collected inside
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
        """Stop the engine thread; it writes the KV disk tier back within its bound first."""
        self._send(Shutdown())
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join, CLOSE_BOUND_S + 10)
            if self._thread.is_alive():
                log.error("the engine thread did not stop within %.0f s", CLOSE_BOUND_S + 10)

    @property
    def is_alive(self) -> bool:
        return self._dead is None

    # -- requests -------------------------------------------------------------------------
    def generate(
        self,
        request_id: str | None,
        prompt_ids: list[int],
        params: SamplingParams,
        *,
        constraint: Any = None,
        namespace: Hashable = None,
        index: int = 0,
    ) -> RequestStream:
        """Queue a request and return the stream of its outputs (the last has `finished`).

        Admission happens here, at the call, before anything is awaited: it raises ValueError
        subclasses for bad input, QueueFullError when `max_num_seqs + max_queued_requests`
        requests are already in flight, and EngineDeadError once the engine stopped. Closing
        or cancelling the stream before its end aborts the request."""
        self.engine.validate(prompt_ids, params)
        rid = request_id or uuid.uuid4().hex
        collector = Collector(self.config.stream_stall_s, lambda: self._send(AbortRequest(rid)))
        with self._streams_lock:  # against the engine thread ending between check and register
            if self._dead is not None:
                raise EngineDeadError(f"engine stopped: {self._dead!r}")
            if self._stop:
                raise EngineDeadError("engine was shut down")
            if rid in self._streams:
                raise ValueError(f"request id {rid!r} is already in use")
            limit = self.max_in_flight
            if limit is not None and len(self._streams) >= limit:
                raise QueueFullError(len(self._streams), limit)
            self._streams[rid] = (asyncio.get_running_loop(), collector)
        self._send(AddRequest(rid, list(prompt_ids), params, constraint, namespace, index))
        return RequestStream(self._release, rid, collector)

    @property
    def max_in_flight(self) -> int | None:
        """Requests admitted at once: running (max_num_seqs) plus queued; None = no bound."""
        queued = self.config.max_queued_requests
        return None if queued is None else self.config.scheduler.max_num_seqs + queued

    @property
    def num_in_flight(self) -> int:
        return len(self._streams)

    def _release(self, rid: str, finished: bool) -> None:
        """A stream's end (event loop): forget it, and abort the request if it still runs."""
        with self._streams_lock:
            self._streams.pop(rid, None)
        if not finished:
            self._send(AbortRequest(rid))

    async def abort(self, request_id: str) -> None:
        self._send(AbortRequest(request_id))

    async def pin_prefix(self, token_ids: list[int], namespace: Hashable = None, ttl_s: float = 300.0) -> int:
        """Engine.pin_prefix, applied by the engine thread between steps."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[int] = loop.create_future()
        self._send(PinPrefix(list(token_ids), namespace, ttl_s, loop, done))
        return await done

    async def flush_cache(self, tenant: object = ALL_TENANTS) -> int:
        """Engine.flush_cache, applied by the engine thread between steps."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[int] = loop.create_future()
        self._send(FlushCache(tenant, loop, done))
        return await done

    async def embed(self, batch: list[list[int]]) -> list[list[float]]:
        if not self.is_embedding:
            raise ValueError(f"model {self.model_name!r} is not an embedding model")
        return await self._pooled(self.engine.model.embed, batch)

    async def classify(self, batch: list[list[int]], segments: list[list[int]] | None = None) -> list[list[float]]:
        """Raw logits `[len(batch), num_labels]` of a model with a classification head; each
        sequence a pair as its tokenizer joins it, with its segment ids (None: all 0)."""
        if not self.traits.num_labels:
            raise ValueError(f"model {self.model_name!r} has no classification head")
        return await self._pooled(lambda ids: self.engine.model.classify(ids, segments), batch)

    async def _pooled(self, run_model: Any, batch: list[list[int]]) -> list[list[float]]:
        """An encoder call on its own thread, one at a time (the engine thread never runs it)."""
        for ids in batch:
            if not ids:
                raise ValueError("each input must contain at least one token")
            if len(ids) > self.max_model_len:
                from agentkv.runtime.errors import PromptTooLongError

                raise PromptTooLongError(len(ids), self.max_model_len)

        def run() -> list[list[float]]:
            with self._embed_lock:
                return np.asarray(run_model(batch), dtype=np.float32).tolist()

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
            loop, collector = target
            try:
                loop.call_soon_threadsafe(collector.put, item)
            except RuntimeError:  # its event loop is closed: nobody will ever read it
                with self._streams_lock:
                    self._streams.pop(rid, None)
                self.engine.abort(rid)  # engine thread: frees its KV now

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
                case FlushCache(tenant=tenant, loop=loop, done=done):
                    freed = self.engine.flush_cache(tenant)
                    loop.call_soon_threadsafe(done.set_result, freed)
                case Shutdown():
                    self._end_streams(None)
                    return
                case _:
                    raise RuntimeError(f"unknown engine message {message!r} (a bug)")

    def _add(self, m: AddRequest) -> None:
        try:
            self.engine.add_request(m.request_id, m.prompt_ids, m.params, m.constraint, m.namespace, m.index)
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
                    self._check_at_exit()
                    return
                if not self.engine.has_unfinished():
                    self._wake.wait(0.5)
                    self._wake.clear()
                    continue
                for out in self.engine.step():
                    self._deliver(out.request_id, out)
                if not self.engine.progressed:  # nothing could run: wait for a change, don't spin
                    self._wake.wait(self.engine.idle_wait_s())
                    self._wake.clear()
        except BaseException as e:  # noqa: BLE001 — reported to every waiting stream
            log.exception("engine thread died")
            self._end_streams(e)

    def _check_at_exit(self) -> None:
        """The pool and the cache agree with themselves once the engine stops (a long-running
        server's leak check; `agentkv bench soak` reads the line)."""
        try:
            self.engine.scheduler.check_integrity()
        except RuntimeError as exc:
            log.error("KV pool and cache integrity at shutdown: FAILED: %s", exc)
        else:
            log.info("KV pool and cache integrity at shutdown: ok (%d blocks used)", self.engine.pool.num_used)

    def _end_streams(self, error: BaseException | None) -> None:
        """The thread ends (died of `error`, or shut down): fail every stream still waiting.
        A stream registers before this, or sees `_dead` / `_stop` and is refused."""
        with self._streams_lock:
            self._dead, self._stop = error, True
            waiting = list(self._streams)
        why = f"engine stopped: {error!r}" if error is not None else "engine was shut down"
        for rid in waiting:
            self._deliver(rid, EngineDeadError(why))

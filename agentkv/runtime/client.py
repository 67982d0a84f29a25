"""`EngineClient`: what a front end (the HTTP server) may use of an engine — exactly that.

AsyncEngine satisfies it; the server depends on this protocol instead of on AsyncEngine, so
another engine (a remote one, a test double of the server's own making) only has to match it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Hashable
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from agentkv.formats.chat_template import ChatTemplate
    from agentkv.formats.tokenizer import Tokenizer
    from agentkv.runtime.outputs import EngineStats, RequestOutput
    from agentkv.runtime.params import SamplingParams
    from agentkv.runtime.rerank import Traits


@runtime_checkable
class EngineClient(Protocol):
    """An engine that streams requests to asyncio callers.

    Attributes are fixed once the engine is built. `generate` admits the request at the call:
    it raises ValueError subclasses (PromptTooLongError, InvalidTokenError, ...) for bad input,
    QueueFullError when the engine's queue is full, and EngineDeadError once the engine
    stopped, before anything is awaited; closing its iterator early aborts the request."""

    tokenizer: Tokenizer
    chat_template: ChatTemplate | None
    model_name: str
    max_model_len: int
    vocab_size: int
    is_embedding: bool
    traits: Traits  # a classification head's labels, Matryoshka embeddings

    generation_config: dict[str, Any]  # the model's sampling defaults ({} when it ships none)

    @property
    def is_alive(self) -> bool:
        """False once the engine stopped after an internal error (it will serve no more)."""

    def start(self) -> None:
        """Begin serving (idempotent)."""

    async def shutdown(self) -> None:
        """Stop serving; requests still running get no further outputs."""

    def generate(
        self,
        request_id: str | None,
        prompt_ids: list[int],
        params: SamplingParams,
        *,
        constraint: Any = None,
        namespace: Hashable = None,
        index: int = 0,
    ) -> AsyncIterator[RequestOutput]:
        """Stream one request's outputs; the last has `finished`."""

    async def abort(self, request_id: str) -> None:
        """Stop a request and free its KV; unknown ids are ignored."""

    async def flush_cache(self, tenant: object) -> int:
        """Drop one tenant's cached KV (RAM and disk), or all; returns the RAM blocks freed."""
        ...

    async def pin_prefix(self, token_ids: list[int], namespace: Hashable = None, ttl_s: float = 300.0) -> int:
        """Keep the cached prefix of `token_ids` from eviction for `ttl_s` seconds; -> its length."""

    async def embed(self, batch: list[list[int]]) -> list[list[float]]:
        """One pooled vector per token list (embedding models only)."""

    async def classify(self, batch: list[list[int]], segments: list[list[int]] | None = None) -> list[list[float]]:
        """Raw classification logits per token list (models with a classification head only)."""

    def stats(self) -> EngineStats:
        """Counters and gauges at this moment (read by /metrics)."""

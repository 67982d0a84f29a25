"""`EngineClient`: what the HTTP server needs of an engine (AsyncEngine satisfies it), so the
server depends on a typed surface rather than on the engine class itself."""
from __future__ import annotations

from typing import Any, AsyncIterator, Protocol

from agentkv.runtime.outputs import EngineStats, RequestOutput
from agentkv.runtime.params import SamplingParams


class EngineClient(Protocol):
    """An engine running behind an event loop: requests stream their outputs; `abort` frees
    a request's KV at once; the attributes are fixed once the model has loaded."""

    tokenizer: Any
    chat_template: Any
    model_name: str
    max_model_len: int
    vocab_size: int
    is_embedding: bool
    generation_config: dict[str, Any]  # the model's sampling defaults ({} when it ships none)

    def start(self) -> None: ...

    async def shutdown(self) -> None: ...

    def generate(self, request_id: str | None, prompt_ids: list[int], params: SamplingParams, *,
                 constraint: Any = None) -> AsyncIterator[RequestOutput]: ...

    async def abort(self, request_id: str) -> None: ...

    async def pin_prefix(self, token_ids: list[int], namespace: Any = None,
                         ttl_s: float = 300.0) -> int: ...

    async def embed(self, batch: list[list[int]]) -> list[list[float]]: ...

    def stats(self) -> EngineStats: ...

"""What one app holds for its life: the engine (or the thread still loading it), the names it
answers to, the API keys and their tenants, the limits, the request-field policy, metrics,
the grammar factory, and what to do when the engine is lost (`on_fatal`)."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from agentkv.runtime.client import EngineClient
from agentkv.server.errors import APIError, not_ready
from agentkv.server.metrics import ServerMetrics

log = logging.getLogger("agentkv.server")

EngineLoader = Callable[[], EngineClient]
FatalHook = Callable[[int, str], None]  # (exit code, why): the server should stop with it


@dataclass(frozen=True, slots=True)
class ServerLimits:
    """What one request may ask of the server (each a `serve` flag)."""

    max_fanout: int = 64  # prompts x n: engine sequences one request may start
    max_body_bytes: int = 16 << 20
    sse_keepalive_s: float | None = 15.0  # a quiet stream gets `: keep-alive` this often
    # /metrics needs an API key when keys are configured (its counters are every tenant's);
    # True serves it to anyone, for a scraper on a private network.
    public_metrics: bool = False
    admin_key: str | None = None  # may flush any tenant's cache, or all (POST /flush_cache)

    def __post_init__(self) -> None:
        for name in ("max_fanout", "max_body_bytes"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name}={value!r} is out of range: allowed an integer >= 1")
        if self.sse_keepalive_s is not None and not self.sse_keepalive_s > 0:
            raise ValueError(f"sse_keepalive_s={self.sse_keepalive_s!r} is out of range: allowed None or a number > 0")


def tenants_of(api_key: str | Mapping[str, str | None] | None) -> dict[str, str]:
    """key -> tenant. A key given without a tenant name is its own tenant, named by a hash
    (the key itself is never kept in a name that could be logged)."""
    if api_key is None:
        return {}
    keys = {api_key: None} if isinstance(api_key, str) else dict(api_key)
    return {key: name or "key-" + hashlib.sha256(key.encode()).hexdigest()[:12] for key, name in keys.items()}


class ServerState:
    """Mutable only while loading (engine/error set once by the loader thread)."""

    def __init__(
        self,
        engine_or_loader: Any,
        *,
        api_key: str | Mapping[str, str | None] | None = None,
        served_model_name: str | None = None,
        strict_request_fields: bool = False,
        chat_template: Any = None,
        limits: ServerLimits | None = None,
        on_fatal: FatalHook | None = None,
    ) -> None:
        self.tenants = tenants_of(api_key)
        self.limits = limits or ServerLimits()
        self.on_fatal = on_fatal
        self.chat_template_override = chat_template
        self.strict_request_fields = strict_request_fields
        self.served_model_name = served_model_name
        self.engine: EngineClient | None = None
        self.load_error: str | None = None
        self.metrics = ServerMetrics(lambda: self.engine)
        self._factory: Any | None = None
        self._factory_lock = threading.Lock()
        self._parsers: tuple[str | None, str | None] = (None, None)  # --tool-call-parser, --reasoning-parser
        self._formats: tuple[Any, Any] | None = None  # (template, its Choice)
        if callable(engine_or_loader) and not hasattr(engine_or_loader, "generate"):
            self._loader: EngineLoader | None = engine_or_loader
        else:
            self._loader = None
            self._set_engine(engine_or_loader)

    # --- lifecycle ----------------------------------------------------------------------------

    def start_loading(self) -> threading.Thread | None:
        """Load the engine in a background thread so /health can answer 503 meanwhile."""
        if self._loader is None:
            return None
        thread = threading.Thread(target=self._load, name="agentkv-load", daemon=True)
        thread.start()
        return thread

    def _load(self) -> None:
        try:
            self._set_engine(self._loader())
        except Exception as exc:  # reported by /health and every request; never swallowed
            log.exception("model failed to load")
            self.load_error = f"{type(exc).__name__}: {exc}"
            if self.on_fatal is not None:  # a flag the model contradicts is a usage error: 2
                self.on_fatal(2 if isinstance(exc, ValueError) else 1, self.load_error)

    @property
    def engine_alive(self) -> bool:
        return self.engine is not None and getattr(self.engine, "is_alive", True)

    def _set_engine(self, engine: EngineClient) -> None:
        engine.start()
        self.engine = engine
        if getattr(engine, "chat_template", None) is not None or self.chat_template_override is not None:
            found = self.output_formats()
            log.info(
                "tool calls: %s (%s); reasoning: %s (%s)",
                found.tool_format,
                found.tool_reason,
                found.reasoning,
                found.reasoning_reason,
            )

    def set_parsers(self, tool_call_parser: str | None = None, reasoning_parser: str | None = None) -> None:
        """Override the detected formats (the serve flags); a ValueError for an unknown name."""
        from agentkv.server.toolformats.registry import check_parsers

        check_parsers(tool_call_parser, reasoning_parser)
        self._parsers, self._formats = (tool_call_parser, reasoning_parser), None

    def output_formats(self) -> Any:
        """The Choice (toolformats.registry) of tool-call format and reasoning parser for the
        template chats render with, detected once per template."""
        from agentkv.server.toolformats.registry import choose, special_token_texts

        template = self.chat_template()
        if self._formats is None or self._formats[0] is not template:
            tokens = special_token_texts(getattr(self.require_engine(), "tokenizer", None))
            self._formats = (template, choose(template, tokens, *self._parsers))
        return self._formats[1]

    @property
    def model_name(self) -> str:
        if self.served_model_name:
            return self.served_model_name
        return self.engine.model_name if self.engine is not None else "loading"

    def chat_template(self) -> Any:
        """The template chats render with: the server's override, else the model's own."""
        if self.chat_template_override is not None:
            return self.chat_template_override
        return self.require_engine().chat_template

    def require_engine(self) -> EngineClient:
        if self.engine is None:
            if self.load_error is not None:
                raise APIError(
                    503,
                    f"The model failed to load: {self.load_error}",
                    type="service_unavailable",
                    code="model_load_failed",
                )
            raise not_ready("The model is still loading; retry when /health answers 200")
        return self.engine

    async def constraint_factory(self) -> Any:
        """The grammar factory, built on first use in a worker thread (it costs a second)."""
        if self._factory is None:
            engine = self.require_engine()

            def build() -> Any:
                from agentkv.runtime.structured import ConstraintFactory

                with self._factory_lock:
                    if self._factory is None:
                        from agentkv.server.toolformats.registry import MARKER_TOKENS

                        self._factory = ConstraintFactory(engine.tokenizer, engine.vocab_size, MARKER_TOKENS)
                return self._factory

            return await asyncio.to_thread(build)
        return self._factory

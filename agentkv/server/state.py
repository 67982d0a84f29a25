"""What one app holds: the engine (or the thread still loading it), the names it answers to,
the API key, metrics and the grammar factory; plus the request-to-engine translations every
endpoint shares (model check, tokens, SamplingParams)."""
from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any, Callable

from agentkv.runtime.client import EngineClient
from agentkv.runtime.errors import EngineDeadError, InvalidTokenError, PromptTooLongError
from agentkv.runtime.params import SamplingParams
from agentkv.server.errors import (
    APIError, bad_request, from_value_error, model_not_found, not_ready, prompt_too_long)
from agentkv.server.metrics import ServerMetrics
from agentkv.server.schemas import SamplingFields

log = logging.getLogger("agentkv.server")

EngineLoader = Callable[[], EngineClient]
_SAMPLING_FIELDS = ("temperature", "top_p", "top_k", "min_p", "seed", "presence_penalty",
                    "frequency_penalty", "repetition_penalty", "ignore_eos", "skip_special_tokens",
                    "include_stop_str_in_output")


class ServerState:
    """Mutable only while loading (engine/error set once by the loader thread)."""

    def __init__(self, engine_or_loader: EngineClient | EngineLoader, *, api_key: str | None = None,
                 served_model_name: str | None = None) -> None:
        self.api_key = api_key
        self.served_model_name = served_model_name
        self.engine: EngineClient | None = None
        self.load_error: str | None = None
        self.metrics = ServerMetrics(lambda: self.engine)
        self._factory: Any | None = None
        self._factory_lock = threading.Lock()
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

    def _set_engine(self, engine: EngineClient) -> None:
        engine.start()
        self.engine = engine

    @property
    def model_name(self) -> str:
        if self.served_model_name:
            return self.served_model_name
        return self.engine.model_name if self.engine is not None else "loading"

    def require_engine(self) -> EngineClient:
        if self.engine is None:
            if self.load_error is not None:
                raise APIError(503, f"The model failed to load: {self.load_error}",
                               type="service_unavailable", code="model_load_failed")
            raise not_ready("The model is still loading; retry when /health answers 200")
        return self.engine

    def check_model(self, name: str | None) -> EngineClient:
        """The engine, if `name` is one this server serves (404 otherwise)."""
        engine = self.require_engine()
        served = [self.model_name] + ([engine.model_name] if self.served_model_name is None else [])
        if name is not None and name not in served:
            raise model_not_found(name, [self.model_name])
        return engine

    # --- translations -------------------------------------------------------------------------

    def check_tokens(self, ids: list[int], param: str) -> None:
        engine = self.require_engine()
        bad = [i for i in ids if not 0 <= i < engine.tokenizer.vocab_size]
        if bad:
            raise bad_request(f"token id {bad[0]} is outside the vocabulary "
                              f"[0, {engine.tokenizer.vocab_size})", param=param)

    def fit_max_tokens(self, prompt_len: int, max_tokens: int | None, param: str) -> int:
        """max_tokens given or the rest of the context; a prompt that leaves no room is a 400
        quoting both lengths."""
        limit = self.require_engine().max_model_len
        if max_tokens is not None and max_tokens < 0:
            raise bad_request(f"{param}={max_tokens} is out of range: allowed an int >= 1", param=param)
        if prompt_len >= limit:
            raise prompt_too_long(prompt_len, limit)
        if max_tokens is None:
            return limit - prompt_len
        if prompt_len + max_tokens > limit:
            raise prompt_too_long(prompt_len, limit, max_tokens)
        return max_tokens

    def sampling_params(self, req: SamplingFields, *, max_tokens: int, logprobs: int | None,
                        prompt_logprobs: int | None = None, seed_offset: int = 0) -> SamplingParams:
        kw: dict[str, Any] = {}
        for name in _SAMPLING_FIELDS:
            value = getattr(req, name)
            if value is not None:
                kw[name] = value
        if req.seed is not None:
            kw["seed"] = req.seed + seed_offset
        if req.stop is not None:
            kw["stop"] = req.stop
        if req.stop_token_ids is not None:
            kw["stop_token_ids"] = req.stop_token_ids
        if req.logit_bias is not None:
            kw["logit_bias"] = req.logit_bias
        try:
            return SamplingParams(max_tokens=max_tokens, logprobs=logprobs,
                                  prompt_logprobs=prompt_logprobs, **kw)
        except ValueError as exc:
            raise from_value_error(exc, {"logprobs": "top_logprobs" if prompt_logprobs is None
                                         else "logprobs"}) from exc

    async def constraint_factory(self) -> Any:
        """The grammar factory, built on first use in a worker thread (it costs a second)."""
        if self._factory is None:
            engine = self.require_engine()

            def build() -> Any:
                from agentkv.runtime.structured import ConstraintFactory

                with self._factory_lock:
                    if self._factory is None:
                        self._factory = ConstraintFactory(engine.tokenizer, engine.vocab_size)
                return self._factory

            return await asyncio.to_thread(build)
        return self._factory


def engine_error(exc: Exception) -> APIError:
    """The engine's boundary exceptions as client errors; anything else is re-raised."""
    if isinstance(exc, PromptTooLongError):
        return prompt_too_long(exc.prompt_len, exc.max_model_len)
    if isinstance(exc, InvalidTokenError):
        return bad_request(str(exc), param="prompt")
    if isinstance(exc, EngineDeadError):
        return APIError(503, str(exc), type="service_unavailable", code="engine_dead")
    if isinstance(exc, ValueError):
        return from_value_error(exc)
    raise exc

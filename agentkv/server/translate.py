"""Request-to-engine translation every endpoint shares: which model was asked for, token ids
in the vocabulary, max_tokens fitted to the context, SamplingParams from the request fields,
and the engine's boundary exceptions mapped to client errors."""

from __future__ import annotations

import logging
from typing import Any

from pydantic import BaseModel

from agentkv.runtime.client import EngineClient
from agentkv.runtime.errors import (
    EngineDeadError,
    InvalidTokenError,
    PromptTooLongError,
    QueueFullError,
    StreamStalledError,
)
from agentkv.runtime.params import SamplingParams
from agentkv.server.errors import (
    APIError,
    bad_request,
    engine_dead,
    from_value_error,
    model_not_found,
    prompt_too_long,
    rate_limited,
)
from agentkv.server.lifecycle import ServerState
from agentkv.server.schemas import SamplingFields
from agentkv.server.serving_lora import adapter_name

log = logging.getLogger("agentkv.server")

_SAMPLING_FIELDS = (
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "ignore_eos",
    "skip_special_tokens",
    "include_stop_str_in_output",
    "stop",
    "stop_token_ids",
    "logit_bias",
)


def check_fields(state: ServerState, req: BaseModel, endpoint: str) -> None:
    """Unknown top-level fields: logged and ignored, or a 400 naming them when the server runs
    with strict request fields."""
    extra = sorted(req.model_extra or {})
    if not extra:
        return
    if state.strict_request_fields:
        raise bad_request(
            f"unknown field(s) {extra} for {endpoint} (this server runs with --strict-request-fields)", param=extra[0]
        )
    log.warning("%s: ignoring unknown field(s) %s", endpoint, extra)


def check_model(state: ServerState, name: str | None) -> EngineClient:
    """The engine, if `name` is one this server serves (404 otherwise)."""
    engine = state.require_engine()
    served = [state.model_name] + ([engine.model_name] if state.served_model_name is None else [])
    if name is not None and name not in served and adapter_name(state, engine, name) is None:
        raise model_not_found(name, [state.model_name, *getattr(getattr(engine, "adapters", None), "names", list)()])
    return engine


def check_tokens(engine: EngineClient, ids: list[int], param: str) -> None:
    bad = [i for i in ids if not 0 <= i < engine.tokenizer.vocab_size]
    if bad:
        raise bad_request(
            f"token id {bad[0]} is outside the vocabulary [0, {engine.tokenizer.vocab_size})", param=param
        )


def fit_max_tokens(engine: EngineClient, prompt_len: int, max_tokens: int | None, param: str) -> int:
    """max_tokens given or the rest of the context; a prompt that leaves no room is a 400
    quoting both lengths."""
    limit = engine.max_model_len
    if max_tokens is not None and max_tokens < 0:
        raise bad_request(f"{param}={max_tokens} is out of range: allowed an int >= 1", param=param)
    if prompt_len >= limit:
        raise prompt_too_long(prompt_len, limit)
    if max_tokens is None:
        return limit - prompt_len
    if prompt_len + max_tokens > limit:
        raise prompt_too_long(prompt_len, limit, max_tokens)
    return max_tokens


def check_min_tokens(min_tokens: int | None, max_tokens: int) -> int:
    """min_tokens (0 when unset), which must lie in [0, max_tokens]."""
    if min_tokens is None:
        return 0
    if not 0 <= min_tokens <= max_tokens:
        raise bad_request(
            f"min_tokens={min_tokens} is out of range: allowed [0, max_tokens={max_tokens}]", param="min_tokens"
        )
    return min_tokens


def sampling_params(
    req: SamplingFields,
    *,
    max_tokens: int,
    logprobs: int | None,
    prompt_logprobs: int | None = None,
    seed_offset: int = 0,
    defaults: dict[str, Any] | None = None,
    keep_special_tokens: bool = False,
) -> SamplingParams:
    """SamplingParams from the request's fields; a field left out (or null) takes the model's
    generation-config `defaults`, else the engine's default. Choice `seed_offset` of n gets
    seed + offset, so choices differ but repeat. `keep_special_tokens` (tools are parsed):
    special tokens stay in the text the tool-call parser reads."""
    kw: dict[str, Any] = dict(defaults or {})
    if keep_special_tokens:
        kw["skip_special_tokens"] = False
    for name in _SAMPLING_FIELDS:
        value = getattr(req, name)
        if value is not None and not (name == "skip_special_tokens" and keep_special_tokens):
            kw[name] = value
    if req.seed is not None:
        kw["seed"] = req.seed + seed_offset
    if req.disable_speculative_decoding:
        kw["speculative"] = False
    try:
        return SamplingParams(max_tokens=max_tokens, logprobs=logprobs, prompt_logprobs=prompt_logprobs, **kw)
    except ValueError as exc:
        raise from_value_error(exc, {"logprobs": "top_logprobs" if prompt_logprobs is None else "logprobs"}) from exc


def engine_error(exc: Exception) -> APIError:
    """The engine's boundary exceptions as client errors; anything else is re-raised."""
    if isinstance(exc, APIError):
        return exc
    if isinstance(exc, PromptTooLongError):
        return prompt_too_long(exc.prompt_len, exc.max_model_len)
    if isinstance(exc, InvalidTokenError):
        return bad_request(str(exc), param="prompt")
    if isinstance(exc, EngineDeadError):
        return engine_dead(str(exc))
    if isinstance(exc, QueueFullError):
        return rate_limited(str(exc))
    if isinstance(exc, StreamStalledError):
        return APIError(408, str(exc), type="timeout_error", code="stream_stalled")
    if isinstance(exc, ValueError):
        return from_value_error(exc)
    raise exc


# What a step failure says when the request's own constraints (grammar, logit_bias,
# penalties) left no token to sample: the client's doing, so a 400, never a 500.
_CLIENT_CAUSED = ("nothing can be sampled",)


def request_failed(error: str) -> APIError:
    """A request that ended with finish_reason "error" inside the engine (the others of its
    batch went on): a 400 when its own constraints led it into a dead end, else a 500 — the
    model or server failed it. Never reported to a client as a finish_reason."""
    if any(marker in error for marker in _CLIENT_CAUSED):
        return bad_request(
            "the request's constraints (response_format, tools, logit_bias, "
            f"penalties) left no token that may come next: {error}",
            code="generation_dead_end",
        )
    return APIError(
        500, f"the request failed inside the engine: {error}", type="internal_server_error", code="request_failed"
    )

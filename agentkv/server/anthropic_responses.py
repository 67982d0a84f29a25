"""Response bodies, stream events and errors of the Anthropic Messages API, shaped as the
official `anthropic` client reads them: `{"type": "error", "error": {"type", "message"}}`
with Anthropic's error type for each status."""

from __future__ import annotations

import json
from typing import Any, Literal

from fastapi.responses import JSONResponse
from pydantic import BaseModel

StopReason = Literal["end_turn", "max_tokens", "stop_sequence", "tool_use"]

ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    503: "overloaded_error",
    529: "overloaded_error",
}


class AnthropicUsage(BaseModel):
    input_tokens: int
    output_tokens: int
    cache_creation_input_tokens: int = 0
    cache_read_input_tokens: int = 0


class MessageResponse(BaseModel):
    id: str
    type: Literal["message"] = "message"
    role: Literal["assistant"] = "assistant"
    model: str
    content: list[dict[str, Any]]
    stop_reason: StopReason | None
    stop_sequence: str | None = None
    usage: AnthropicUsage


class CountTokensResponse(BaseModel):
    input_tokens: int


def anthropic_error_body(status: int, message: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": ERROR_TYPES.get(status, "api_error"), "message": message}}


def anthropic_error_response(status: int, message: str, **_: Any) -> JSONResponse:
    """An error in Anthropic's shape (OpenAI's param/code fields have no place in it)."""
    return JSONResponse(anthropic_error_body(status, message), status_code=status)


def event(name: str, payload: dict[str, Any]) -> str:
    """One server-sent event, Anthropic style: a named event and its JSON (type repeated)."""
    return f"event: {name}\ndata: {json.dumps({'type': name, **payload})}\n\n"


def usage_of(prompt_len: int, cached_len: int, pinned_len: int, output_tokens: int) -> AnthropicUsage:
    """Anthropic splits the prompt three ways: read from the cache (the radix hit), written
    to it for a cache_control breakpoint (what a pin holds past the hit), and the rest."""
    creation = max(0, min(pinned_len, prompt_len) - cached_len)
    return AnthropicUsage(
        input_tokens=prompt_len - cached_len - creation,
        output_tokens=output_tokens,
        cache_creation_input_tokens=creation,
        cache_read_input_tokens=cached_len,
    )

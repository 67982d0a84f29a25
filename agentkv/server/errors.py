"""OpenAI-shaped errors: the one exception the handlers raise and the app-wide handlers that
turn every client mistake (bad JSON, wrong types, bad ranges, long prompts) into a 4xx body
`{"error": {"message", "type", "param", "code"}}` — never a 500."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException

log = logging.getLogger("agentkv.server")

# Engine field names -> the OpenAI request field a client wrote.
_PARAM_ALIASES = {"logprobs": "top_logprobs"}


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorDetail


class APIError(Exception):
    """A request the server refuses; carries the HTTP status and the OpenAI error fields."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code
        self.headers = headers or {}

    def response(self) -> JSONResponse:
        response = error_response(self.status, self.message, type=self.type, param=self.param, code=self.code)
        response.headers.update(self.headers)
        return response


def error_body(
    message: str, *, type: str = "invalid_request_error", param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    return {
        "error": {
            "message": utf8_safe(message),
            "type": type,
            "param": None if param is None else utf8_safe(param),
            "code": code,
        }
    }


def utf8_safe(text: str) -> str:
    """`text` with any lone surrogate written as its escape: an error that quotes a client's
    bad string must still encode as UTF-8 JSON."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def error_response(status: int, message: str, **kw: Any) -> JSONResponse:
    return JSONResponse(error_body(message, **kw), status_code=status)


def bad_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, param=param, code=code)


def model_not_found(name: str, served: list[str]) -> APIError:
    return APIError(
        404, f"The model {name!r} does not exist; this server serves {served}", param="model", code="model_not_found"
    )


def unauthorized(message: str = "Invalid or missing API key") -> APIError:
    return APIError(401, message, type="authentication_error", code="invalid_api_key")


RETRY_AFTER_S = 1  # what a 429 asks a client to wait: one engine step or a few


def rate_limited(message: str) -> APIError:
    """OpenAI's 429: the official clients wait `Retry-After` and retry by themselves."""
    return APIError(
        429, message, type="rate_limit_error", code="rate_limit_exceeded", headers={"Retry-After": str(RETRY_AFTER_S)}
    )


def engine_dead(message: str) -> APIError:
    return APIError(503, message, type="service_unavailable", code="engine_dead")


def too_large(num_bytes: int | None, limit: int) -> APIError:
    got = f"{num_bytes} bytes" if num_bytes is not None else "more"
    return APIError(
        413,
        f"request body is {got}, over this server's limit of {limit} bytes (--max-body-bytes)",
        code="request_too_large",
    )


def not_ready(message: str) -> APIError:
    return APIError(503, message, type="service_unavailable", code="model_loading")


def from_value_error(exc: ValueError, api_names: dict[str, str] | None = None) -> APIError:
    """A ValueError from SamplingParams names its field first (`top_p=2.0 is out of range`);
    that field becomes `param`, spelled the way the client wrote it."""
    message = str(exc)
    match = re.match(r"([a-z_]+)", message)
    param = match.group(1) if match else None
    if param is not None:
        param = (api_names or {}).get(param, _PARAM_ALIASES.get(param, param))
    return bad_request(message, param=param)


def prompt_too_long(prompt_len: int, max_model_len: int, max_tokens: int | None = None) -> APIError:
    if max_tokens is None:
        message = (
            f"This model's maximum context length is {max_model_len} tokens, but the prompt has {prompt_len} tokens"
        )
    else:
        message = (
            f"This model's maximum context length is {max_model_len} tokens, but "
            f"{prompt_len + max_tokens} tokens were requested ({prompt_len} in the "
            f"prompt, {max_tokens} for the completion)"
        )
    return bad_request(message, param="messages", code="context_length_exceeded")


def _validation_message(exc: RequestValidationError) -> tuple[str, str | None]:
    errors = exc.errors()
    if not errors:
        return "Invalid request body", None
    first = errors[0]
    loc = [str(p) for p in first.get("loc", ()) if p != "body"]
    if first.get("type") == "json_invalid":
        return f"Malformed JSON body: {first.get('msg')}", None
    param = ".".join(loc) or None
    parts = []
    for err in errors[:5]:
        where = ".".join(str(p) for p in err.get("loc", ()) if p != "body") or "body"
        parts.append(f"{where}: {err.get('msg')}")
    return "; ".join(parts), param


ErrorShape = Callable[..., JSONResponse]  # (status, message, type=, param=, code=) -> response


def shaped_error(path: str, shapes: dict[str, ErrorShape] | None, exc: APIError) -> JSONResponse:
    """`exc` as the response of the API `path` belongs to (OpenAI's shape unless `shapes`
    gives that path's prefix its own), with the error's headers (Retry-After)."""
    shape = next((s for prefix, s in (shapes or {}).items() if path.startswith(prefix)), error_response)
    response = shape(exc.status, exc.message, type=exc.type, param=exc.param, code=exc.code)
    response.headers.update(exc.headers)
    return response


def install_handlers(app: FastAPI, shapes: dict[str, ErrorShape] | None = None) -> None:
    """Every error path answers in OpenAI's shape, or in the shape `shapes` gives the paths
    under a prefix (each API keeps its own); a bug still answers (500), shaped too."""

    def respond(request: Request, status: int, message: str, **kw: Any) -> JSONResponse:
        return shaped_error(request.url.path, shapes, APIError(status, utf8_safe(message), **kw))

    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError) -> JSONResponse:
        return shaped_error(request.url.path, shapes, exc)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        message, param = _validation_message(exc)
        return respond(request, 400, message, param=param)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        return respond(request, exc.status_code, str(exc.detail), type=kind)

    @app.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception) -> JSONResponse:
        log.exception("internal error: %s", exc)
        return respond(request, 500, f"Internal server error: {type(exc).__name__}", type="internal_server_error")

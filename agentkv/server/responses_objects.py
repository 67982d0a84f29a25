"""Response bodies and stream events of the OpenAI Responses API, shaped as the official
`openai` client reads them (openai.types.responses): the Response object, its output items
(message, function_call, reasoning), usage with cached tokens, and the numbered SSE events."""

from __future__ import annotations

import json
import time
import uuid
from typing import Any, Literal

from pydantic import BaseModel, Field


def item_id(prefix: str) -> str:
    """OpenAI-style ids: `resp_…`, `msg_…`, `fc_…`, `rs_…`."""
    return f"{prefix}_{uuid.uuid4().hex}"


class OutputText(BaseModel):
    type: Literal["output_text"] = "output_text"
    text: str
    annotations: list[Any] = Field(default_factory=list)
    logprobs: list[Any] = Field(default_factory=list)


class OutputMessage(BaseModel):
    id: str
    type: Literal["message"] = "message"
    role: Literal["assistant"] = "assistant"
    status: Literal["in_progress", "completed", "incomplete"]
    content: list[OutputText]


class FunctionCallOut(BaseModel):
    id: str
    type: Literal["function_call"] = "function_call"
    call_id: str
    name: str
    arguments: str
    status: Literal["in_progress", "completed", "incomplete"]


class ReasoningText(BaseModel):
    type: Literal["reasoning_text"] = "reasoning_text"
    text: str


class ReasoningOut(BaseModel):
    id: str
    type: Literal["reasoning"] = "reasoning"
    summary: list[Any] = Field(default_factory=list)
    content: list[ReasoningText]
    status: Literal["in_progress", "completed", "incomplete"]


OutputItem = OutputMessage | FunctionCallOut | ReasoningOut


class InputTokensDetails(BaseModel):
    cached_tokens: int  # the radix-cache hit
    cache_write_tokens: int = 0


class OutputTokensDetails(BaseModel):
    reasoning_tokens: int = 0


class ResponseUsage(BaseModel):
    input_tokens: int
    input_tokens_details: InputTokensDetails
    output_tokens: int
    output_tokens_details: OutputTokensDetails = Field(default_factory=OutputTokensDetails)
    total_tokens: int


def usage_of(prompt_len: int, cached_len: int, output_tokens: int) -> ResponseUsage:
    return ResponseUsage(
        input_tokens=prompt_len,
        output_tokens=output_tokens,
        total_tokens=prompt_len + output_tokens,
        input_tokens_details=InputTokensDetails(cached_tokens=cached_len),
    )


class IncompleteDetails(BaseModel):
    reason: Literal["max_output_tokens"]


class ResponseObject(BaseModel):
    """The Response resource; `output` and `usage` fill in as generation ends."""

    id: str
    object: Literal["response"] = "response"
    created_at: float = Field(default_factory=lambda: int(time.time()))
    completed_at: float | None = None
    status: Literal["in_progress", "completed", "incomplete", "failed"]
    error: dict[str, Any] | None = None
    incomplete_details: IncompleteDetails | None = None
    model: str
    instructions: str | None = None
    output: list[OutputItem] = Field(default_factory=list)
    parallel_tool_calls: bool
    tool_choice: Any
    tools: list[dict[str, Any]]
    temperature: float | None = None
    top_p: float | None = None
    max_output_tokens: int | None = None
    previous_response_id: str | None = None
    text: dict[str, Any] | None = None
    store: bool = True
    metadata: dict[str, str] | None = None
    usage: ResponseUsage | None = None


class DeletedResponse(BaseModel):
    id: str
    object: Literal["response"] = "response"
    deleted: bool = True


class EventWriter:
    """Numbered server-sent events (mutates its counter): `event: <type>` and its JSON,
    `type` and `sequence_number` included, as OpenAI frames a Responses stream."""

    def __init__(self) -> None:
        self.sequence_number = 0

    def __call__(self, type: str, **payload: Any) -> str:
        body = {"type": type, "sequence_number": self.sequence_number, **payload}
        self.sequence_number += 1
        return f"event: {type}\ndata: {json.dumps(body, ensure_ascii=False)}\n\n"

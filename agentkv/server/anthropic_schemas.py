"""Request bodies of the Anthropic Messages API (POST /v1/messages, /v1/messages/count_tokens):
system as a string or text blocks, messages of text / tool_use / tool_result blocks, tools
with an `input_schema`, tool_choice auto / any / tool / none, and `cache_control` breakpoints."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field

from agentkv.server.schemas import Open, Request

TTL_SECONDS = {"5m": 300.0, "1h": 3600.0}


class CacheControl(Open):
    type: Literal["ephemeral"]
    ttl: str | None = None  # "5m" (default) or "1h"


class TextBlock(Open):
    type: Literal["text"]
    text: str
    cache_control: CacheControl | None = None


class ToolUseBlock(Open):
    type: Literal["tool_use"]
    id: str
    name: str
    input: dict[str, Any]
    cache_control: CacheControl | None = None


class ToolResultBlock(Open):
    type: Literal["tool_result"]
    tool_use_id: str
    content: str | list[TextBlock] | None = None
    is_error: bool | None = None
    cache_control: CacheControl | None = None


class UnsupportedBlock(Open):
    """Blocks this server does not read (images, documents, thinking): accepted by the schema
    so the answer is a 400 naming the block type."""

    type: Literal["image", "document", "thinking", "redacted_thinking", "search_result"]
    cache_control: CacheControl | None = None


Block = Annotated[TextBlock | ToolUseBlock | ToolResultBlock | UnsupportedBlock, Field(discriminator="type")]


class Message(Open):
    role: Literal["user", "assistant"]
    content: str | list[Block]


class Tool(Open):
    name: str = Field(pattern=r"^[A-Za-z0-9_\-]{1,64}$")
    description: str | None = None
    input_schema: dict[str, Any]
    type: Literal["custom"] | None = None
    cache_control: CacheControl | None = None


class ToolChoice(Open):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


class MessagesRequest(Request):
    model: str
    max_tokens: int
    messages: list[Message] = Field(min_length=1)
    system: str | list[TextBlock] | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    stop_sequences: list[str] | None = None
    stream: bool = False
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    metadata: dict[str, Any] | None = None
    thinking: dict[str, Any] | None = None  # enabled/disabled and the budget reach the template
    service_tier: str | None = None
    cache_control: CacheControl | None = None  # a breakpoint after the last message


class CountTokensRequest(Request):
    model: str
    messages: list[Message] = Field(min_length=1)
    system: str | list[TextBlock] | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    thinking: dict[str, Any] | None = None

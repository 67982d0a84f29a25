"""Request bodies of the OpenAI-compatible API as pydantic models: they are both the validator
(strict types: a string is never silently an int) and the source of /openapi.json.

Generation requests keep unknown top-level fields in `model_extra` (the server logs them, or
with --strict-request-fields answers a 400 naming them); `null` for a field means its default,
as OpenAI allows. Nested objects (tools, response_format) stay closed. Messages and tool calls
ignore unknown keys, because clients echo back assistant messages with extra fields."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

StopField = str | list[str] | None
Prompt = str | list[str] | list[int] | list[list[int]]


_SURROGATE = re.compile("[\ud800-\udfff]")


def lone_surrogate_at(value: Any) -> str | None:
    """The path of the first string (or key) in a JSON value that holds a lone UTF-16
    surrogate, or None. JSON's `"\\ud800"` escape decodes to one, but it is not Unicode text:
    no tokenizer or UTF-8 encoder takes it. Iterative, because a body can nest deeply."""
    stack: list[tuple[tuple[Any, ...], Any]] = [((), value)]
    while stack:
        path, item = stack.pop()
        if isinstance(item, str):
            if _SURROGATE.search(item):
                return ".".join(map(str, path)) or "body"
        elif isinstance(item, dict):
            for key, child in item.items():
                if isinstance(key, str) and _SURROGATE.search(key):
                    return ".".join(map(str, (*path, key)))
                stack.append(((*path, key), child))
        elif isinstance(item, list):
            stack.extend(((*path, i), child) for i, child in enumerate(item))
    return None


class TextOnly(BaseModel):
    """A top-level body whose strings must be Unicode text (see `lone_surrogate_at`)."""

    @model_validator(mode="before")
    @classmethod
    def _no_lone_surrogates(cls, data: Any) -> Any:
        where = lone_surrogate_at(data)
        if where is not None:  # the path itself may quote the surrogate: escape it
            where = where.encode("utf-8", "backslashreplace").decode("utf-8")
            raise ValueError(
                f"{where} holds a lone surrogate (a UTF-16 half, e.g. an unpaired \\ud800 "
                f"escape), which is not valid Unicode text"
            )
        return data


class Closed(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=True)


class Open(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True, populate_by_name=True)


class Request(TextOnly):
    """A top-level request body: unknown fields are kept (see `model_extra`), null = default."""

    model_config = ConfigDict(extra="allow", strict=True, populate_by_name=True)

    @model_validator(mode="before")
    @classmethod
    def _null_is_default(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        return {
            k: v
            for k, v in data.items()
            if v is not None or k not in cls.model_fields or cls.model_fields[k].default is None
        }


# --- messages and tools -----------------------------------------------------------------------


class TextPart(Open):
    type: Literal["text"]
    text: str


class OtherPart(Open):
    """Any non-text part (image_url, input_audio, file): accepted by the schema so the server can
    answer with a clear 400 naming the part type rather than a generic validation error."""

    type: Literal["image_url", "input_audio", "file", "refusal"]


ContentPart = Annotated[TextPart | OtherPart, Field(discriminator="type")]


class FunctionCall(Open):
    name: str
    arguments: str


class ToolCall(Open):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(Open):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None  # an earlier assistant turn's reasoning, for templates that render it


class FunctionDef(Closed):
    name: str = Field(pattern=r"^[A-Za-z0-9_.\-]{1,64}$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ToolDef(Closed):
    type: Literal["function"]
    function: FunctionDef


class NamedFunction(Closed):
    name: str


class NamedToolChoice(Closed):
    type: Literal["function"]
    function: NamedFunction


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice


class JsonSchemaSpec(Closed):
    name: str = Field(pattern=r"^[A-Za-z0-9_\-]{1,64}$")
    description: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormat(Closed):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaSpec | None = None


class StreamOptions(Closed):
    include_usage: bool = False
    continuous_usage_stats: bool = False


# --- shared sampling fields ------------------------------------------------------------------


class LoraScale(Closed):
    """llama.cpp's per-request adapter: `id` its place in the adapter list, `scale` 0 = off."""

    id: int
    scale: float


class SamplingFields(Request):
    """Fields shared by chat and completions; the ranges themselves are SamplingParams' job,
    so every range error names the field the same way whichever endpoint was called."""

    model: str
    n: int = 1
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    seed: int | None = None
    stop: StopField = None
    stop_token_ids: list[int] | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    # SGLang's name: true = never draft for this request (same tokens, no speculation).
    disable_speculative_decoding: bool = False
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    min_tokens: int | None = None
    # Accepted for compatibility; no effect here (the radix cache needs no key).
    metadata: dict[str, str] | None = None
    store: bool | None = None
    service_tier: str | None = None
    prompt_cache_key: str | None = None
    # vLLM's field: only requests with the same salt (and tenant) share cached prefixes.
    cache_salt: str | None = Field(default=None, min_length=1)
    # llama.cpp's field: the adapter (by its place in /v1/models' adapter order) and its scale
    lora: list[LoraScale] | None = None


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    response_format: ResponseFormat | None = None
    tools: list[ToolDef] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool | None = None
    add_generation_prompt: bool = True
    chat_template_kwargs: dict[str, Any] | None = None
    reasoning_effort: str | None = None  # passed to the chat template, which may use it


class CompletionRequest(SamplingFields):
    prompt: Prompt
    max_tokens: int | None = 16
    echo: bool = False
    logprobs: int | None = None
    best_of: int | None = None
    suffix: str | None = None
    response_format: ResponseFormat | None = None
    add_special_tokens: bool = True


class EmbeddingRequest(Request):
    model: str
    input: Prompt
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = None
    user: str | None = None


class TokenizeRequest(Closed, TextOnly):
    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool = True
    add_generation_prompt: bool = True
    tools: list[ToolDef] | None = None


class DetokenizeRequest(Closed, TextOnly):
    model: str | None = None
    tokens: list[int]

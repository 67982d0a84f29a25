"""Request bodies of the OpenAI Responses API (POST /v1/responses): `input` as a string or
items (messages of input_text / output_text parts, function_call, function_call_output,
reasoning), flat function tools, tool_choice, `text.format` and the sampling fields.

Item, part, tool and tool_choice types this server does not serve are accepted by the
schema (a catch-all per union) so the answer is a 400 naming the type, not a generic
validation error."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Discriminator, Field, Tag

from agentkv.server.schemas import Closed, Open, Request


def _kind(tags: dict[str, str], default: str | None = None) -> Any:
    """A discriminator: the tag `tags` gives the object's `type`, else "other" (whose schema
    then refuses a `type` that is not a string: a 400, never a TypeError on an unhashable one)."""

    def kind(value: Any) -> str:
        tag = value.get("type", default) if isinstance(value, dict) else getattr(value, "type", default)
        return tags.get(tag, "other") if isinstance(tag, str) else "other"

    return Discriminator(kind)


def _same(*names: str) -> dict[str, str]:
    return {name: name for name in names}


# --- content parts ------------------------------------------------------------------------------


class TextPart(Open):
    type: str  # one of _TEXT_TYPES (the discriminator checks)
    text: str


class RefusalPart(Open):
    type: Literal["refusal"]
    refusal: str


class OtherPart(Open):
    """input_image, input_file, input_audio, ...: answered with a 400 naming the type."""

    type: str


_TEXT_TYPES = ("input_text", "output_text", "text", "summary_text", "reasoning_text")
Part = Annotated[
    Annotated[TextPart, Tag("text")] | Annotated[RefusalPart, Tag("refusal")] | Annotated[OtherPart, Tag("other")],
    _kind({**dict.fromkeys(_TEXT_TYPES, "text"), "refusal": "refusal"}),
]


# --- input items --------------------------------------------------------------------------------


class MessageItem(Open):
    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[Part]
    id: str | None = None
    status: str | None = None


class FunctionCallItem(Open):
    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str
    id: str | None = None
    status: str | None = None


class FunctionCallOutputItem(Open):
    type: Literal["function_call_output"]
    call_id: str
    output: str | list[Part]
    id: str | None = None
    status: str | None = None


class ReasoningItem(Open):
    """A reasoning item echoed back by a client: not shown to the model again (chat
    templates drop earlier turns' reasoning too)."""

    type: Literal["reasoning"]
    id: str | None = None
    summary: list[Part] = Field(default_factory=list)
    content: list[Part] | None = None
    encrypted_content: str | None = None


class OtherItem(Open):
    """item_reference, computer_call, web_search_call, ...: answered with a 400."""

    type: str


InputItem = Annotated[
    Annotated[MessageItem, Tag("message")]
    | Annotated[FunctionCallItem, Tag("function_call")]
    | Annotated[FunctionCallOutputItem, Tag("function_call_output")]
    | Annotated[ReasoningItem, Tag("reasoning")]
    | Annotated[OtherItem, Tag("other")],
    _kind(_same("message", "function_call", "function_call_output", "reasoning"), default="message"),
]


# --- tools, tool_choice, text.format -----------------------------------------------------------


class FunctionTool(Open):
    """Responses' flat function tool (no nested `function` object)."""

    type: Literal["function"]
    name: str = Field(pattern=r"^[A-Za-z0-9_.\-]{1,64}$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class OtherTool(Open):
    """Hosted tools (web_search, file_search, code_interpreter, ...): answered with a 400."""

    type: str


Tool = Annotated[
    Annotated[FunctionTool, Tag("function")] | Annotated[OtherTool, Tag("other")], _kind(_same("function"))
]


class FunctionChoice(Closed):
    type: Literal["function"]
    name: str


class OtherChoice(Open):
    """allowed_tools, hosted-tool choices, ...: answered with a 400."""

    type: str


ToolChoice = (
    Literal["none", "auto", "required"]
    | Annotated[
        Annotated[FunctionChoice, Tag("function")] | Annotated[OtherChoice, Tag("other")], _kind(_same("function"))
    ]
)


class TextFormat(Closed):
    type: Literal["text", "json_object", "json_schema"]
    name: str | None = Field(default=None, pattern=r"^[A-Za-z0-9_\-]{1,64}$")
    description: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class TextConfig(Open):
    format: TextFormat | None = None
    verbosity: Literal["low", "medium", "high"] | None = None


class ResponsesRequest(Request):
    model: str
    input: str | list[InputItem]
    instructions: str | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool | None = None
    text: TextConfig | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    stream: bool = False
    store: bool = True
    previous_response_id: str | None = None
    reasoning: dict[str, Any] | None = None  # its effort goes to the chat template
    # Not served: a value that asks for them is a 400 (a silent no-op would mislead).
    background: bool | None = None
    conversation: str | dict[str, Any] | None = None
    # Accepted for compatibility; no effect here (the radix cache needs no key).
    metadata: dict[str, str] | None = None
    user: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    prompt_cache_retention: str | None = None
    service_tier: str | None = None
    include: list[str] | None = None
    truncation: Literal["auto", "disabled"] | None = None

"""Responses API requests -> the shared chat path: input items to chat messages (on top of
the stored history a previous_response_id names), flat tools and tool_choice to a
ToolPolicy, text.format to a response_format, sampling fields to SamplingFields; and the
model's output back into chat messages for the history of the next turn."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from agentkv.server.errors import bad_request
from agentkv.server.responses_schemas import (
    FunctionCallItem,
    FunctionCallOutputItem,
    FunctionChoice,
    FunctionTool,
    MessageItem,
    OtherItem,
    OtherPart,
    ReasoningItem,
    RefusalPart,
    ResponsesRequest,
)
from agentkv.server.schemas import ChatMessage, JsonSchemaSpec, ResponseFormat, SamplingFields, ToolCall
from agentkv.server.tool_policy import ToolPolicy, tool_policy
from agentkv.server.tools import ParsedCall


def _text(content: str | list[Any], where: str) -> str:
    if isinstance(content, str):
        return content
    texts = []
    for j, part in enumerate(content):
        if isinstance(part, OtherPart):
            raise bad_request(
                f"content part type {part.type!r} is not supported by this model; only input_text / output_text parts",
                param=f"{where}.{j}",
            )
        texts.append(part.refusal if isinstance(part, RefusalPart) else part.text)
    return "".join(texts)


def _call(item: FunctionCallItem) -> dict[str, Any]:
    return {"id": item.call_id, "type": "function", "function": {"name": item.name, "arguments": item.arguments}}


def input_messages(req: ResponsesRequest, history: Sequence[ChatMessage]) -> list[ChatMessage]:
    """This request's input items as chat messages, appended to `history` (a function_call
    joins the assistant message it follows). A function_call_output must answer a call made
    in the conversation, as OpenAI requires."""
    if isinstance(req.input, str):
        return [ChatMessage(role="user", content=req.input)]
    call_ids = {c.id for m in history for c in m.tool_calls or []}
    out: list[ChatMessage] = []
    for i, item in enumerate(req.input):
        where = f"input.{i}"
        if isinstance(item, MessageItem):
            out.append(ChatMessage(role=item.role, content=_text(item.content, f"{where}.content")))
        elif isinstance(item, FunctionCallItem):
            call_ids.add(item.call_id)
            last = out[-1] if out else None
            if last is not None and last.role == "assistant":
                last.tool_calls = [*(last.tool_calls or []), ToolCall.model_validate(_call(item))]
            else:
                out.append(
                    ChatMessage.model_validate({"role": "assistant", "content": "", "tool_calls": [_call(item)]})
                )
        elif isinstance(item, FunctionCallOutputItem):
            if item.call_id not in call_ids:
                raise bad_request(
                    f"No tool call found for function call output with call_id {item.call_id!r}",
                    param=f"{where}.call_id",
                )
            out.append(
                ChatMessage(role="tool", tool_call_id=item.call_id, content=_text(item.output, f"{where}.output"))
            )
        elif isinstance(item, OtherItem):
            raise bad_request(
                f"input item type {item.type!r} is not supported by this server; "
                f"only message, function_call, function_call_output and reasoning",
                param=f"{where}.type",
            )
        else:
            assert isinstance(item, ReasoningItem)  # earlier reasoning is not shown again
    return out


def output_message(content: str | None, calls: Sequence[ParsedCall]) -> ChatMessage:
    """The model's answer as the assistant message the next turn's prompt shows."""
    return ChatMessage.model_validate(
        {
            "role": "assistant",
            "content": content or "",
            "tool_calls": [
                {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}} for c in calls
            ]
            or None,
        }
    )


def tool_dicts(req: ResponsesRequest) -> list[dict[str, Any]]:
    """The flat function tools, as the chat-shaped tool dicts the prompt renders."""
    out = []
    for i, tool in enumerate(req.tools or []):
        if not isinstance(tool, FunctionTool):
            raise bad_request(
                f"tool type {tool.type!r} is not supported by this server; only 'function' tools",
                param=f"tools.{i}.type",
            )
        fn = {
            "name": tool.name,
            **({"description": tool.description} if tool.description else {}),
            "parameters": tool.parameters or {"type": "object", "properties": {}},
            **({"strict": True} if tool.strict else {}),
        }
        out.append({"type": "function", "function": fn})
    return out


def policy_of(req: ResponsesRequest) -> ToolPolicy:
    choice: Any = req.tool_choice
    if isinstance(choice, FunctionChoice):
        choice = {"type": "function", "function": {"name": choice.name}}
    elif choice is not None and not isinstance(choice, str):
        raise bad_request(
            f"tool_choice type {choice.type!r} is not supported by this server; "
            f"only 'none', 'auto', 'required' or a function",
            param="tool_choice",
        )
    return tool_policy(tool_dicts(req), choice, req.parallel_tool_calls)


def response_format(req: ResponsesRequest) -> ResponseFormat | None:
    """text.format as the response_format the shared constraint builder reads."""
    fmt = req.text.format if req.text is not None else None
    if fmt is None or fmt.type != "json_schema":
        return None if fmt is None else ResponseFormat(type=fmt.type)
    if fmt.schema_ is None or not fmt.name:
        raise bad_request(
            "text.format of type 'json_schema' needs a name and a schema",
            param="text.format.schema" if fmt.name else "text.format.name",
        )
    return ResponseFormat(
        type="json_schema", json_schema=JsonSchemaSpec(name=fmt.name, schema=fmt.schema_, strict=fmt.strict)
    )


def sampling_fields(req: ResponsesRequest) -> SamplingFields:
    return SamplingFields.model_validate(
        {"model": req.model, "temperature": req.temperature, "top_p": req.top_p, "stream": req.stream}
    )


def check_served(req: ResponsesRequest) -> None:
    """Fields asking for what this server does not do are a 400, not a silent no-op."""
    if req.background:
        raise bad_request("background responses are not supported by this server", param="background")
    if req.conversation is not None:
        raise bad_request(
            "conversation objects are not supported by this server; use previous_response_id", param="conversation"
        )


def template_kwargs(req: ResponsesRequest) -> dict[str, Any]:
    effort = (req.reasoning or {}).get("effort")
    return {"reasoning_effort": effort} if effort is not None else {}

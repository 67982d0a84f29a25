"""Anthropic Messages requests -> the shared chat path: blocks to chat messages, tools and
tool_choice to a ToolPolicy, sampling fields to SamplingFields, and where each cache_control
breakpoint falls in the conversation."""

from __future__ import annotations

import json
from typing import Any, NamedTuple

from agentkv.server.anthropic_schemas import (
    TTL_SECONDS,
    CacheControl,
    CountTokensRequest,
    MessagesRequest,
    TextBlock,
    ToolResultBlock,
    ToolUseBlock,
    UnsupportedBlock,
)
from agentkv.server.errors import bad_request
from agentkv.server.schemas import ChatMessage, SamplingFields
from agentkv.server.tool_policy import ToolPolicy, tool_policy


class Breakpoint(NamedTuple):
    """The prefix up to the end of the first `num_messages` chat messages stays cached."""

    num_messages: int
    ttl_s: float


class Conversation(NamedTuple):
    messages: list[ChatMessage]
    breakpoints: list[Breakpoint]


def _ttl(cc: CacheControl | None, where: str) -> float | None:
    if cc is None:
        return None
    ttl = cc.ttl or "5m"
    if ttl not in TTL_SECONDS:
        raise bad_request(
            f"{where}.cache_control.ttl={ttl!r} is not supported: allowed {sorted(TTL_SECONDS)}",
            param=f"{where}.cache_control.ttl",
        )
    return TTL_SECONDS[ttl]


def _text(content: str | list[TextBlock] | None) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    return "".join(block.text for block in content)


def _system(req: MessagesRequest | CountTokensRequest) -> tuple[list[ChatMessage], float | None]:
    """The system message and the longest TTL asked on it (or on the tools before it)."""
    ttls = [_ttl(t.cache_control, f"tools.{i}") for i, t in enumerate(req.tools or [])]
    if isinstance(req.system, list):
        ttls += [_ttl(b.cache_control, f"system.{i}") for i, b in enumerate(req.system)]
    ttl = max((t for t in ttls if t is not None), default=None)
    text = _text(req.system)
    return ([ChatMessage(role="system", content=text)] if req.system else []), ttl


def _blocks(role: str, blocks: list[Any], where: str) -> tuple[list[ChatMessage], float | None]:
    """One Anthropic message's blocks -> chat messages (tool results become tool messages)."""
    out: list[ChatMessage] = []
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    ttl: float | None = None
    for j, block in enumerate(blocks):
        ttl = max(ttl or 0.0, _ttl(block.cache_control, f"{where}.content.{j}") or 0.0) or None
        if isinstance(block, UnsupportedBlock):
            raise bad_request(
                f"content block type {block.type!r} is not supported by this "
                f"server; only text, tool_use and tool_result",
                param=f"{where}.content.{j}",
            )
        if isinstance(block, TextBlock):
            texts.append(block.text)
        elif isinstance(block, ToolUseBlock):
            calls.append(
                {
                    "id": block.id,
                    "type": "function",
                    "function": {"name": block.name, "arguments": json.dumps(block.input, ensure_ascii=False)},
                }
            )
        elif isinstance(block, ToolResultBlock):
            body = _text(block.content)
            out.append(
                ChatMessage(
                    role="tool", tool_call_id=block.tool_use_id, content=f"Error: {body}" if block.is_error else body
                )
            )
    if texts or calls or not out:
        out.append(ChatMessage.model_validate({"role": role, "content": "".join(texts), "tool_calls": calls or None}))
    return out, ttl


MAX_BREAKPOINTS = 4  # Anthropic's limit on blocks with cache_control in one request


def _check_breakpoints(req: MessagesRequest | CountTokensRequest) -> None:
    """Anthropic's 400 for more cache_control blocks than it allows (each one is a pin the
    server would hold, and a render of the conversation's head)."""
    marks = [t.cache_control for t in req.tools or []]
    marks += [b.cache_control for b in req.system] if isinstance(req.system, list) else []
    marks += [
        getattr(b, "cache_control", None) for m in req.messages if not isinstance(m.content, str) for b in m.content
    ]
    marks.append(getattr(req, "cache_control", None))
    found = sum(mark is not None for mark in marks)
    if found > MAX_BREAKPOINTS:
        raise bad_request(
            f"A maximum of {MAX_BREAKPOINTS} blocks with cache_control may be provided. Found {found}.",
            param="cache_control",
        )


def conversation(req: MessagesRequest | CountTokensRequest) -> Conversation:
    _check_breakpoints(req)
    messages, ttl = _system(req)
    breakpoints = [Breakpoint(max(len(messages), 1), ttl)] if ttl else []
    for i, msg in enumerate(req.messages):
        if isinstance(msg.content, str):
            messages.append(ChatMessage(role=msg.role, content=msg.content))
            continue
        converted, ttl = _blocks(msg.role, msg.content, f"messages.{i}")
        messages += converted
        if ttl:
            breakpoints.append(Breakpoint(len(messages), ttl))
    ttl = _ttl(getattr(req, "cache_control", None), "body")
    if ttl:
        breakpoints.append(Breakpoint(len(messages), ttl))
    return Conversation(messages, breakpoints)


def policy_of(req: MessagesRequest | CountTokensRequest) -> ToolPolicy:
    tools = [
        {
            "type": "function",
            "function": {
                "name": t.name,
                **({"description": t.description} if t.description else {}),
                "parameters": t.input_schema,
            },
        }
        for t in req.tools or []
    ]
    choice: Any = None
    parallel = None
    tc = req.tool_choice
    if tc is not None:
        parallel = False if tc.disable_parallel_tool_use else None
        if tc.type == "tool":
            if not tc.name:
                raise bad_request("tool_choice type 'tool' needs a name", param="tool_choice.name")
            choice = {"type": "function", "function": {"name": tc.name}}
        else:
            choice = {"auto": "auto", "any": "required", "none": "none"}[tc.type]
    return tool_policy(tools, choice, parallel)


def sampling_fields(req: MessagesRequest) -> SamplingFields:
    """The sampling fields the shared prologue reads (stop_sequences are stop strings)."""
    return SamplingFields.model_validate(
        {
            "model": req.model,
            "temperature": req.temperature,
            "top_p": req.top_p,
            "top_k": req.top_k,
            "stop": req.stop_sequences,
            "stream": req.stream,
        }
    )


def stop_reason(out: Any, num_calls: int, stop_sequences: list[str] | None) -> tuple[str, str | None]:
    """(stop_reason, stop_sequence) for a finished output."""
    if num_calls:
        return "tool_use", None
    if out.finish_reason == "length":
        return "max_tokens", None
    if isinstance(out.stop_reason, str) and out.stop_reason in (stop_sequences or []):
        return "stop_sequence", out.stop_reason
    return "end_turn", None

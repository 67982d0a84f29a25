"""Chat messages -> prompt text through the model's own chat template, with a Hermes-style
fallback for templates that know nothing of tools (SmolLM2's): the tool table goes into the
system turn, assistant tool calls are written as `<tool_call>` JSON, and tool results become
`<tool_response>` blocks in a user turn, which every template accepts."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import jinja2

from agentkv.formats.chat_template import JSONArguments
from agentkv.server.errors import APIError, bad_request
from agentkv.server.schemas import ChatMessage, TextPart
from agentkv.server.tools import render_tool_call

HERMES_TOOLS_PROMPT = """# Tools

You may call one or more functions to assist with the user query.

You are provided with function signatures within <tools></tools> XML tags:
<tools>
{tools}
</tools>

For each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:
<tool_call>
{{"name": <function-name>, "arguments": <args-json-object>}}
</tool_call>"""


def message_text(msg: ChatMessage, index: int) -> str:
    """A message's content as one string; only text parts are understood."""
    content = msg.content
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    texts = []
    for j, part in enumerate(content):
        if not isinstance(part, TextPart):
            raise bad_request(
                f"content part type {part.type!r} is not supported by this model; only 'text' parts are",
                param=f"messages.{index}.content.{j}",
            )
        texts.append(part.text)
    return "".join(texts)


def _arguments_obj(arguments: str) -> Any:
    """The client's arguments string as the template's value: an object keeps its text, so
    `tojson` renders back what the model generated (JSONArguments); other text stays as sent."""
    try:
        value = json.loads(arguments)
    except json.JSONDecodeError:
        return arguments
    return JSONArguments(value, arguments.strip()) if isinstance(value, dict) else value


def _native_messages(messages: Sequence[ChatMessage]) -> list[dict[str, Any]]:
    """Messages for a template that renders tools itself (Qwen, Llama 3.1, ...)."""
    out = []
    for i, msg in enumerate(messages):
        item: dict[str, Any] = {
            "role": "system" if msg.role == "developer" else msg.role,
            "content": message_text(msg, i),
        }
        if msg.name is not None:
            item["name"] = msg.name
        if msg.tool_calls:
            item["tool_calls"] = [
                {
                    "id": c.id,
                    "type": "function",
                    "function": {"name": c.function.name, "arguments": _arguments_obj(c.function.arguments)},
                }
                for c in msg.tool_calls
            ]
        if msg.tool_call_id is not None:
            item["tool_call_id"] = msg.tool_call_id
        if msg.reasoning_content is not None:  # back to templates that render it (Qwen3, gpt-oss)
            item["reasoning_content"] = msg.reasoning_content
        out.append(item)
    return out


def hermes_system_prompt(tools: Sequence[dict[str, Any]]) -> str:
    table = "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
    return HERMES_TOOLS_PROMPT.format(tools=table)


def _hermes_messages(messages: Sequence[ChatMessage], tools: Sequence[dict[str, Any]] | None) -> list[dict[str, Any]]:
    """Messages rewritten so a tool-unaware template renders a Hermes transcript."""
    out: list[dict[str, Any]] = []
    for i, msg in enumerate(messages):
        text = message_text(msg, i)
        if msg.role == "tool":
            block = f"<tool_response>\n{text}\n</tool_response>"
            if out and out[-1].get("_tool_results"):
                out[-1]["content"] += "\n" + block
            else:
                out.append({"role": "user", "content": block, "_tool_results": True})
            continue
        role = "system" if msg.role == "developer" else msg.role
        if msg.tool_calls:
            calls = [render_tool_call(c.function.name, c.function.arguments) for c in msg.tool_calls]
            text = "\n".join(([text] if text else []) + calls)
        out.append({"role": role, "content": text})
    if tools:
        prompt = hermes_system_prompt(tools)
        if out and out[0]["role"] == "system":
            out[0]["content"] = f"{out[0]['content']}\n\n{prompt}" if out[0]["content"] else prompt
        else:
            out.insert(0, {"role": "system", "content": prompt})
    for item in out:
        item.pop("_tool_results", None)
    return out


def render_chat(
    template: Any,
    messages: Sequence[ChatMessage],
    *,
    tools: Sequence[dict[str, Any]] | None = None,
    add_generation_prompt: bool = True,
    template_kwargs: dict[str, Any] | None = None,
) -> str:
    """Prompt text for `messages`. `template` is the model's ChatTemplate (None: a 400, the
    model cannot chat). Tools are rendered natively when the template supports them."""
    if template is None:
        raise bad_request("This model has no chat template; use /v1/completions", param="messages")
    kwargs = dict(template_kwargs or {})
    uses_tools = bool(tools) or any(m.role == "tool" or m.tool_calls for m in messages)
    try:
        if uses_tools and getattr(template, "supports_tools", False):
            return template.render(
                _native_messages(messages),
                add_generation_prompt=add_generation_prompt,
                tools=list(tools) if tools else None,
                **kwargs,
            )
        return template.render(_hermes_messages(messages, tools), add_generation_prompt=add_generation_prompt, **kwargs)
    except APIError:
        raise
    except (ValueError, TypeError, KeyError, jinja2.TemplateError) as exc:
        # A template raising on a message order it forbids is the client's mistake, not ours.
        raise bad_request(f"The chat template could not render these messages: {exc}", param="messages") from exc

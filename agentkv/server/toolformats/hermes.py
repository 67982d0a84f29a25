"""Hermes / Qwen2.5 / Qwen3: `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>`,
one call per block, blocks repeated for parallel calls."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from agentkv.server.toolformats.base import (
    DECODER,
    Call,
    CallGrammar,
    ParseContext,
    dumps,
    json_prefix,
    parameters,
    tool_name,
)
from agentkv.server.toolformats.blocks import BlockFormat, Body

# `{"name": "<name>", "arguments": ` -- the head a call's arguments follow (`parameters` is
# Llama's spelling, which models trained on both write).
JSON_HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"(?:arguments|parameters)"\s*:\s*')


def read_json_call(body: str, ctx: ParseContext, complete: bool) -> tuple[Call | None, int]:
    """One `{"name": ..., "arguments": ...}` object at the start of `body`: (the call, where
    the object ends), or (None, 0). Name-first objects keep their arguments text as written
    (so streamed fragments add up to it) and count once the head is in; keys after the
    arguments (Mistral's `"id"`) are read once the object closes. Other key orders, and
    arguments given as a JSON string, are decoded whole once complete."""
    head = JSON_HEAD.match(body)
    if head is None:
        return _fallback(body, ctx) if complete else (None, 0)
    name = _unescape(head.group(1))
    args, whole = json_prefix(body[head.end() :])
    if not ctx.known(name) or not args.startswith("{"):
        return _fallback(body, ctx) if complete else (None, 0)
    if not whole:
        return Call(name, args), len(body)
    start = len(body) - len(body.lstrip())
    try:
        obj, end = DECODER.raw_decode(body, start)
    except json.JSONDecodeError:
        return Call(name, args), len(body)  # the object is not closed (yet): it runs on
    call_id = obj.get("id") if isinstance(obj, dict) else None
    return Call(name, args, call_id if isinstance(call_id, str) and call_id else None), end


def _fallback(body: str, ctx: ParseContext) -> tuple[Call | None, int]:
    stripped = body.lstrip()
    try:
        obj, end = DECODER.raw_decode(stripped)
    except json.JSONDecodeError:
        return None, 0
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not ctx.known(obj["name"]):
        return None, 0
    args: Any = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            return None, 0
    if not isinstance(args, dict):
        return None, 0
    return Call(obj["name"], dumps(args)), len(body) - len(stripped) + end


def _unescape(name: str) -> str:
    try:
        return json.loads(f'"{name}"')
    except json.JSONDecodeError:
        return name


class HermesFormat(BlockFormat):
    name = "hermes"
    trigger = "<tool_call>"
    begin = "<tool_call>"
    ends = ("</tool_call>",)

    def read_body(self, body: str, ctx: ParseContext, complete: bool) -> Body:
        call, end = read_json_call(body, ctx, complete)
        if call is None:
            return Body([])
        rest = body[end:]
        return Body([call], rest if rest.strip() else "")

    def grammar(self, tools: Sequence[dict[str, Any]]) -> CallGrammar:
        calls = [
            [
                ("lit", f'<tool_call>\n{{"name": {dumps(tool_name(t))}, "arguments": '),
                ("json", parameters(t)),
                ("lit", "}\n</tool_call>"),
            ]
            for t in tools
        ]
        return CallGrammar("", calls, "\n", "")

    def render_calls(self, calls: Sequence[tuple[str, str]]) -> str:
        return "\n".join(f"<tool_call>\n{call_json(n, a)}\n</tool_call>" for n, a in calls)


def call_json(name: str, arguments: str, key: str = "arguments") -> str:
    """`{"name": ..., "arguments": {...}}` with the arguments text kept as given."""
    return f'{{"name": {dumps(name)}, "{key}": {arguments}}}'

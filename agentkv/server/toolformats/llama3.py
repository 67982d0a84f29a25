"""Llama 3.1 / 3.2 / 3.3 JSON calls: `<|python_tag|>{"name": ..., "parameters": {...}}` or the
bare object at the start of the output (what the template teaches), several joined by `;`;
`arguments` is read as well as `parameters`. The call runs to `<|eom_id|>`/`<|eot_id|>` or
the end of the output."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from agentkv.server.toolformats.base import (
    Call,
    CallGrammar,
    ParseContext,
    Scan,
    Triggered,
    call_tags,
    dumps,
    parameters,
    tool_name,
)
from agentkv.server.toolformats.blocks import BlockFormat, Body
from agentkv.server.toolformats.hermes import call_json, read_json_call

_SEPARATOR = re.compile(r"\s*;\s*")


class Llama3JsonFormat(BlockFormat):
    name = "llama3_json"
    begin = "<|python_tag|>"
    ends = ("<|eom_id|>", "<|eot_id|>")

    def find_begin(self, text: str, start: int) -> tuple[int, int]:
        if start == 0 and text.lstrip().startswith("{"):
            return 0, 0  # a bare call opens the output
        return super().find_begin(text, start)

    def scan(self, text: str, final: bool, ctx: ParseContext) -> Scan:
        if not final and not text.strip():
            return Scan([], 0, [])  # leading whitespace: a bare call may still follow
        return super().scan(text, final, ctx)

    def read_body(self, body: str, ctx: ParseContext, complete: bool) -> Body:
        return read_call_list(body, ctx, complete, _SEPARATOR)

    def grammar(self, tools: Sequence[dict[str, Any]]) -> CallGrammar:
        calls = [
            [("lit", f'{{"name": {dumps(tool_name(t))}, "parameters": '), ("json", parameters(t)), ("lit", "}")]
            for t in tools
        ]
        return CallGrammar("", calls, "; ", "")

    def render_calls(self, calls: Sequence[tuple[str, str]]) -> str:
        return "; ".join(call_json(n, a, key="parameters") for n, a in calls)

    def strict_calls(self, tools: Sequence[dict[str, Any]]) -> Triggered | None:
        """A call opens with `<|python_tag|>` or bare, at `{"name": `: from either on, the call
        follows the grammar (a bare one counts as a call only where it opens the output)."""
        tags = call_tags(self.grammar(tools))
        return [self.begin, '{"name": '], [(self.begin + b, p, e) for b, p, e in tags] + tags


def read_call_list(body: str, ctx: ParseContext, complete: bool, separator: re.Pattern[str]) -> Body:
    """JSON call objects one after another, `separator` between: (calls, text left over)."""
    calls: list[Call] = []
    pos = 0
    while True:
        call, end = read_json_call(body[pos:], ctx, complete)
        if call is None:
            return Body(calls, body[pos:] if body[pos:].strip() else "")
        calls.append(call)
        pos += end
        sep = separator.match(body, pos)
        if sep is None or pos >= len(body):
            rest = body[pos:]
            return Body(calls, rest if rest.strip() else "")
        pos = sep.end()

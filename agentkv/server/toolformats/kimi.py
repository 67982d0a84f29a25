"""Kimi K2: `<|tool_calls_section_begin|>` then per call `<|tool_call_begin|>functions.NAME:IDX
<|tool_call_argument_begin|>{args}<|tool_call_end|>`, then `<|tool_calls_section_end|>`. The
`functions.NAME:IDX` string is the call's id, as Kimi's template writes it back."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from agentkv.server.toolformats.base import Call, CallGrammar, ParseContext, json_prefix, parameters, tool_name
from agentkv.server.toolformats.blocks import BlockFormat, Body

SECTION_BEGIN, SECTION_END = "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"
CALL_BEGIN, ARGS_BEGIN, CALL_END = "<|tool_call_begin|>", "<|tool_call_argument_begin|>", "<|tool_call_end|>"
_ID = re.compile(r"\s*((?:functions\.)?([A-Za-z0-9_\-.]+?):(\d+))\s*<\|tool_call_argument_begin\|>")


class KimiFormat(BlockFormat):
    name = "kimi_k2"
    begin = SECTION_BEGIN
    ends = (SECTION_END, "<|tool_call_section_end|>")

    def find_begin(self, text: str, start: int) -> tuple[int, int]:
        found = [(p, p + len(m)) for m in self.begin_markers() if (p := text.find(m, start)) >= 0]
        return min(found) if found else (-1, -1)

    def begin_markers(self) -> tuple[str, ...]:
        return (SECTION_BEGIN, "<|tool_call_section_begin|>")

    def read_body(self, body: str, ctx: ParseContext, complete: bool) -> Body:
        calls: list[Call] = []
        pos = 0
        while body[pos:].lstrip().startswith(CALL_BEGIN):
            start = body.index(CALL_BEGIN, pos) + len(CALL_BEGIN)
            head = _ID.match(body, start)
            if head is None or not ctx.known(head.group(2)):
                break
            args, whole = json_prefix(body[head.end() :])
            if not args.startswith("{"):
                break
            calls.append(Call(head.group(2), args, call_id=head.group(1)))
            stop = body.find(CALL_END, head.end())
            if not whole or stop < 0:
                return Body(calls)
            pos = stop + len(CALL_END)
        rest = body[pos:]
        return Body(calls, rest if rest.strip() else "")

    def grammar(self, tools: Sequence[dict[str, Any]]) -> CallGrammar:
        calls = [
            [
                ("lit", f"{CALL_BEGIN}functions.{tool_name(t)}:"),
                ("regex", "[0-9]{1,3}"),
                ("lit", ARGS_BEGIN),
                ("json", parameters(t)),
                ("lit", CALL_END),
            ]
            for t in tools
        ]
        return CallGrammar(SECTION_BEGIN, calls, "", SECTION_END)

    def render_calls(self, calls: Sequence[tuple[str, str]]) -> str:
        inner = "".join(f"{CALL_BEGIN}functions.{n}:{i}{ARGS_BEGIN}{a}{CALL_END}" for i, (n, a) in enumerate(calls))
        return SECTION_BEGIN + inner + SECTION_END

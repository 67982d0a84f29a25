"""DeepSeek V3 / R1 and V3.1 / V3.2: calls in a `<｜tool▁calls▁begin｜>...<｜tool▁calls▁end｜>`
section, each `<｜tool▁call▁begin｜>...<｜tool▁call▁end｜>`. V3 writes
`function<｜tool▁sep｜>NAME\\n```json\\n{args}\\n```` inside a call, V3.1 `NAME<｜tool▁sep｜>{args}`;
both are read, and the variant chosen renders its own."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from agentkv.server.toolformats.base import Call, CallGrammar, ParseContext, json_prefix, parameters, tool_name
from agentkv.server.toolformats.blocks import BlockFormat, Body

CALLS_BEGIN, CALLS_END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
CALL_BEGIN, CALL_END, SEP = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"
_V3_NAME = re.compile(r"([^\n<]+)\n```json\n")
_V3_CLOSE = re.compile(r"\s*```\s*")


class DeepSeekFormat(BlockFormat):
    begin = CALLS_BEGIN
    ends = (CALLS_END,)

    def __init__(self, v31: bool) -> None:
        self.v31 = v31
        self.name = "deepseek_v31" if v31 else "deepseek_v3"

    def read_body(self, body: str, ctx: ParseContext, complete: bool) -> Body:
        calls: list[Call] = []
        pos = 0
        while body[pos:].lstrip().startswith(CALL_BEGIN):
            start = body.index(CALL_BEGIN, pos) + len(CALL_BEGIN)
            call, end = _read_call(body, start, ctx)
            if call is None:
                break
            calls.append(call)
            if end < 0:
                return Body(calls)  # its arguments are still coming
            pos = end
        rest = body[pos:]
        return Body(calls, rest if rest.strip() else "")

    def grammar(self, tools: Sequence[dict[str, Any]]) -> CallGrammar:
        if self.v31:
            calls = [
                [("lit", f"{CALL_BEGIN}{tool_name(t)}{SEP}"), ("json", parameters(t)), ("lit", CALL_END)] for t in tools
            ]
            return CallGrammar(CALLS_BEGIN, calls, "", CALLS_END)
        calls = [
            [
                ("lit", f"{CALL_BEGIN}function{SEP}{tool_name(t)}\n```json\n"),
                ("json", parameters(t)),
                ("lit", f"\n```{CALL_END}"),
            ]
            for t in tools
        ]
        return CallGrammar(CALLS_BEGIN, calls, "\n", CALLS_END)

    def render_calls(self, calls: Sequence[tuple[str, str]]) -> str:
        if self.v31:
            inner = "".join(f"{CALL_BEGIN}{n}{SEP}{a}{CALL_END}" for n, a in calls)
        else:
            inner = "\n".join(f"{CALL_BEGIN}function{SEP}{n}\n```json\n{a}\n```{CALL_END}" for n, a in calls)
        return CALLS_BEGIN + inner + CALLS_END


def _read_call(body: str, start: int, ctx: ParseContext) -> tuple[Call | None, int]:
    """The call whose text starts at `start`: (call, where the text after its end marker
    starts, or -1 while it is unfinished), or (None, 0) when its head is not (yet) whole."""
    sep = body.find(SEP, start)
    if sep < 0:
        return None, 0
    before, after = body[start:sep].strip(), body[sep + len(SEP) :]
    fenced = before == "function" and not after.lstrip().startswith("{")
    if fenced:
        head = _V3_NAME.match(after)
        if head is None:
            return None, 0
        name, args_at = head.group(1).strip(), sep + len(SEP) + head.end()
    else:
        name, args_at = before, sep + len(SEP)
    args, whole = json_prefix(body[args_at:])
    if not ctx.known(name) or not args.startswith("{"):
        return None, 0
    if not whole:
        return Call(name, args), -1
    end = args_at + len(body[args_at:]) - len(body[args_at:].lstrip()) + len(args)
    if fenced and (close := _V3_CLOSE.match(body, end)) is not None:
        end = close.end()
    stop = body.find(CALL_END, end)
    if stop < 0 or body[end:stop].strip():
        return Call(name, args), (-1 if stop < 0 else end)
    return Call(name, args), stop + len(CALL_END)

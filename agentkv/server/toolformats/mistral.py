"""Mistral: `[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]` (tokenizer v3, v7) and
`[TOOL_CALLS]NAME[ARGS]{...}` repeated per call (v11+; v13 may put `[CALL_ID]ID` before
`[ARGS]`). Call ids are 9 alphanumeric characters, as Mistral's API and templates demand."""

from __future__ import annotations

import random
import re
import string
from collections.abc import Sequence
from typing import Any

from agentkv.server.toolformats.base import Call, CallGrammar, ParseContext, dumps, json_prefix, parameters, tool_name
from agentkv.server.toolformats.blocks import BlockFormat, Body
from agentkv.server.toolformats.hermes import call_json
from agentkv.server.toolformats.llama3 import read_call_list

TOOL_CALLS = "[TOOL_CALLS]"
ARGS = "[ARGS]"
CALL_ID = "[CALL_ID]"
_NAMED = re.compile(r"\s*([A-Za-z0-9_.\-]+)(?:\[CALL_ID\]([A-Za-z0-9]+))?(\[ARGS\]|(?=\{))")
_COMMA = re.compile(r"\s*,\s*")
_ALPHANUMERIC = string.ascii_letters + string.digits


class MistralFormat(BlockFormat):
    name = "mistral"
    trigger = TOOL_CALLS
    begin = TOOL_CALLS
    ends = ("</s>",)

    def __init__(self, args_form: bool = True) -> None:
        self.args_form = args_form  # render `NAME[ARGS]{...}` (v11+) or the JSON list (v3)
        self.name = "mistral" if args_form else "mistral_v3"

    def new_call_id(self) -> str:
        return "".join(random.choices(_ALPHANUMERIC, k=9))

    def _find_end(self, text: str, start: int) -> tuple[int, int]:
        stop, end_len = super()._find_end(text, start)
        nxt = text.find(TOOL_CALLS, start)
        if nxt >= 0 and (stop < 0 or nxt < stop):
            return nxt, 0  # the next call's marker ends this one and begins the next block
        return stop, end_len

    def read_body(self, body: str, ctx: ParseContext, complete: bool) -> Body:
        if body.lstrip().startswith("["):
            return self._read_list(body, ctx, complete)
        head = _NAMED.match(body)
        if head is None or not ctx.known(head.group(1)):
            return Body([])
        args, whole = json_prefix(body[head.end() :])
        if not args.startswith("{"):
            return Body([])
        rest = body[head.end() :].lstrip()[len(args) :] if whole else ""
        return Body([Call(head.group(1), args, head.group(2))], rest if rest.strip() else "")

    @staticmethod
    def _read_list(body: str, ctx: ParseContext, complete: bool) -> Body:
        inner = body.lstrip()[1:]
        read = read_call_list(inner, ctx, complete, _COMMA)
        rest = re.sub(r"^\s*\]", "", read.rest) if read.calls else read.rest
        return Body(read.calls, rest if rest.strip() else "")

    def grammar(self, tools: Sequence[dict[str, Any]]) -> CallGrammar:
        if self.args_form:
            calls = [[("lit", f"{TOOL_CALLS}{tool_name(t)}{ARGS}"), ("json", parameters(t))] for t in tools]
            return CallGrammar("", calls, "", "")
        calls = [
            [("lit", f'{{"name": {dumps(tool_name(t))}, "arguments": '), ("json", parameters(t)), ("lit", "}")]
            for t in tools
        ]
        return CallGrammar(TOOL_CALLS + "[", calls, ", ", "]")

    def render_calls(self, calls: Sequence[tuple[str, str]]) -> str:
        if self.args_form:
            return "".join(f"{TOOL_CALLS}{n}{ARGS}{a}" for n, a in calls)
        return TOOL_CALLS + "[" + ", ".join(call_json(n, a) for n, a in calls) + "]"

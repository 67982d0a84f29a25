"""Qwen3-Coder / Qwen3.5 XML: `<tool_call>\n<function=NAME>\n<parameter=P>\nvalue\n</parameter>
\n</function>\n</tool_call>`; each value is text, typed by the tool's JSON schema."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from agentkv.server.toolformats.base import (
    Call,
    CallGrammar,
    ParseContext,
    Piece,
    listed_parameters,
    object_text,
    tool_name,
    typed_value,
    xml_value,
)
from agentkv.server.toolformats.blocks import BlockFormat, Body

_FUNCTION = re.compile(r"\s*<function=([^>\n]*)>")
_PARAMETER = re.compile(r"\s*<parameter=([^>\n]*)>")
_VALUE_END = re.compile(r"</parameter>|(?=<parameter=)|(?=</function>)")


def strip_newlines(value: str) -> str:
    """The template writes a newline after the opening tag and before the closing one."""
    value = value.removeprefix("\n")
    return value.removesuffix("\n")


class Qwen3CoderFormat(BlockFormat):
    name = "qwen3_coder"
    trigger = "<tool_call>"
    begin = "<tool_call>"
    ends = ("</tool_call>",)

    def read_body(self, body: str, ctx: ParseContext, complete: bool) -> Body:
        head = _FUNCTION.match(body)
        if head is None or not ctx.known(head.group(1).strip()):
            return Body([])
        name = head.group(1).strip()
        props = (ctx.schemas.get(name) or {}).get("properties") or {}
        pairs: list[tuple[str, Any]] = []
        pos = head.end()
        while (param := _PARAMETER.match(body, pos)) is not None:
            end = _VALUE_END.search(body, param.end())
            if end is None and not complete:
                break
            stop = end.start() if end is not None else len(body)
            key = param.group(1).strip()
            pairs.append((key, typed_value(strip_newlines(body[param.end() : stop]), props.get(key))))
            pos = end.end() if end is not None else len(body)
        if not complete:
            return Body([Call(name, object_text(pairs, closed=False))])
        rest = re.sub(r"^\s*(</function>)?\s*", "", body[pos:])
        return Body([Call(name, object_text(pairs, closed=True))], rest)

    def grammar(self, tools: Sequence[dict[str, Any]]) -> CallGrammar:
        calls = []
        for tool in tools:
            pieces: list[Piece] = [("lit", f"<tool_call>\n<function={tool_name(tool)}>\n")]
            for key, schema in listed_parameters(tool):
                pieces += [("lit", f"<parameter={key}>\n"), xml_value(schema), ("lit", "\n</parameter>\n")]
            calls.append([*pieces, ("lit", "</function>\n</tool_call>")])
        return CallGrammar("", calls, "\n", "")

    def render_calls(self, calls: Sequence[tuple[str, str]]) -> str:
        blocks = []
        for name, arguments in calls:
            params = "".join(
                f"<parameter={k}>\n{v if isinstance(v, str) else json.dumps(v, ensure_ascii=False)}\n</parameter>\n"
                for k, v in json.loads(arguments).items()
            )
            blocks.append(f"<tool_call>\n<function={name}>\n{params}</function>\n</tool_call>")
        return "\n".join(blocks)

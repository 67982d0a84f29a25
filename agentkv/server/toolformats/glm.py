"""GLM-4.5 / 4.6 / 4.7: `<tool_call>NAME\n<arg_key>k</arg_key>\n<arg_value>v</arg_value>\n
</tool_call>` (4.7 may omit the newlines); each value is text, typed by the tool's schema."""

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

_NAME = re.compile(r"\s*([^\n<]+?)\s*(?=\n|<arg_key>|$)")
_PAIR = re.compile(r"\s*<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>", re.DOTALL)


class GlmFormat(BlockFormat):
    name = "glm45"
    trigger = "<tool_call>"
    begin = "<tool_call>"
    ends = ("</tool_call>",)

    def read_body(self, body: str, ctx: ParseContext, complete: bool) -> Body:
        head = _NAME.match(body)
        if head is None or not ctx.known(head.group(1)) or (not complete and head.end() == len(body)):
            return Body([])
        name = head.group(1)
        props = (ctx.schemas.get(name) or {}).get("properties") or {}
        pairs: list[tuple[str, Any]] = []
        pos = head.end()
        while (pair := _PAIR.match(body, pos)) is not None:
            key = pair.group(1).strip()
            pairs.append((key, typed_value(pair.group(2), props.get(key))))
            pos = pair.end()
        rest = body[pos:]
        return Body([Call(name, object_text(pairs, closed=complete))], rest if complete and rest.strip() else "")

    def grammar(self, tools: Sequence[dict[str, Any]]) -> CallGrammar:
        calls = []
        for tool in tools:
            pieces: list[Piece] = [("lit", f"<tool_call>{tool_name(tool)}\n")]
            for key, schema in listed_parameters(tool):
                pieces += [
                    ("lit", f"<arg_key>{key}</arg_key>\n<arg_value>"),
                    xml_value(schema),
                    ("lit", "</arg_value>\n"),
                ]
            calls.append([*pieces, ("lit", "</tool_call>")])
        return CallGrammar("", calls, "\n", "")

    def render_calls(self, calls: Sequence[tuple[str, str]]) -> str:
        blocks = []
        for name, arguments in calls:
            pairs = "".join(
                f"<arg_key>{k}</arg_key>\n<arg_value>{v if isinstance(v, str) else json.dumps(v, ensure_ascii=False)}"
                "</arg_value>\n"
                for k, v in json.loads(arguments).items()
            )
            blocks.append(f"<tool_call>{name}\n{pairs}</tool_call>")
        return "\n".join(blocks)

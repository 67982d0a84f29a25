"""Pythonic calls (Llama 3.2 small models, Llama 4): the output is a Python list of calls,
`[get_weather(city="Paris"), f(x=1)]`, values Python literals; Llama 4 may wrap it in
`<|python_start|>...<|python_end|>`. A call counts once its closing parenthesis is in and
it parses (keyword arguments only), so its arguments are sent whole."""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Sequence
from typing import Any

from agentkv.server.toolformats.base import (
    Call,
    CallGrammar,
    ParseContext,
    Piece,
    Scan,
    Triggered,
    dumps,
    listed_parameters,
    tool_name,
)
from agentkv.server.toolformats.blocks import BlockFormat, Body

_NAME = re.compile(r"\s*([A-Za-z_][A-Za-z0-9_.\-]*)\s*\(")
_OPEN, _CLOSE = "([{", ")]}"


class PythonicFormat(BlockFormat):
    name = "pythonic"
    begin = "<|python_start|>"
    ends = ("<|python_end|>",)

    def find_begin(self, text: str, start: int) -> tuple[int, int]:
        if start == 0 and text.lstrip().startswith("["):
            return 0, len(text) - len(text.lstrip())  # the list opens the output
        return super().find_begin(text, start)

    def scan(self, text: str, final: bool, ctx: ParseContext) -> Scan:
        if not final and not text.strip():
            return Scan([], 0, [])
        return super().scan(text, final, ctx)

    def read_body(self, body: str, ctx: ParseContext, complete: bool) -> Body:
        stripped = body.lstrip()
        if not stripped.startswith("["):
            return Body([])
        text, pos, calls = stripped, 1, []
        while (head := _NAME.match(text, pos)) is not None and ctx.known(head.group(1)):
            close = _matching_paren(text, head.end())
            if close < 0:
                break
            arguments = _keywords(text[head.start() : close + 1].strip())
            if arguments is None:
                break
            calls.append(Call(head.group(1), arguments))
            sep = re.compile(r"\s*,").match(text, close + 1)
            pos = sep.end() if sep else close + 1
            if sep is None:
                break
        rest = re.sub(r"^\s*\]", "", text[pos:]) if calls else text
        return Body(calls, rest if rest.strip() else "")

    def grammar(self, tools: Sequence[dict[str, Any]]) -> CallGrammar:
        """Keyword values as JSON, which Python reads the same for strings and numbers;
        booleans and null are spelled the Python way, other types are left out."""
        calls = []
        for tool in tools:
            pieces: list[Piece] = [("lit", f"{tool_name(tool)}(")]
            params = [(k, s) for k, s in listed_parameters(tool) if _python_piece(s) is not None]
            for i, (key, schema) in enumerate(params):
                pieces += [("lit", (", " if i else "") + f"{key}="), _python_piece(schema)]  # type: ignore[list-item]
            calls.append([*pieces, ("lit", ")")])
        return CallGrammar("[", calls, ", ", "]")

    def strict_calls(self, tools: Sequence[dict[str, Any]]) -> Triggered | None:
        """No marker opens the list, and `[` alone is too common to hold text to: a call is
        held to the grammar once `[NAME(` of a tool is written, or `<|python_start|>`."""
        plan = self.grammar(tools)
        more: Piece = ("star", [("lit", plan.sep), ("or", plan.calls)])
        tags = [(plan.begin + p[0][1], [*p[1:], more], plan.end) for p in plan.calls]
        wrapped = (self.begin + plan.begin, [("or", plan.calls), more], plan.end + self.ends[0])
        return [b for b, _, _ in tags] + [self.begin], [*tags, wrapped]

    def render_calls(self, calls: Sequence[tuple[str, str]]) -> str:
        parts = []
        for name, arguments in calls:
            kwargs = ", ".join(f"{k}={_py(v)}" for k, v in json.loads(arguments).items())
            parts.append(f"{name}({kwargs})")
        return "[" + ", ".join(parts) + "]"


def _python_piece(schema: dict[str, Any]) -> Piece | None:
    kind = schema.get("type")
    if kind == "boolean":
        return ("ebnf", '"True" | "False"')
    if kind == "null":
        return ("lit", "None")
    if kind in ("string", "integer", "number") or "enum" in schema:
        return ("json", schema)
    return None


def _py(value: Any) -> str:
    if isinstance(value, bool) or value is None:
        return {True: "True", False: "False", None: "None"}[value]
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_py(k)}: {_py(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(_py(v) for v in value) + "]"
    return json.dumps(value, ensure_ascii=False)


def _matching_paren(text: str, pos: int) -> int:
    """Index of the `)` closing the call whose arguments start at `pos`, or -1 if not yet in.
    Brackets inside string literals do not count."""
    depth, quote, i = 1, "", pos
    while i < len(text):
        ch = text[i]
        if quote:
            if ch == "\\":
                i += 1
            elif ch == quote:
                quote = ""
        elif ch in "'\"":
            quote = ch
        elif ch in _OPEN:
            depth += 1
        elif ch in _CLOSE:
            depth -= 1
            if depth == 0:
                return i if ch == ")" else -1
        i += 1
    return -1


def _keywords(source: str) -> str | None:
    """`f(a=1, b="x")` -> '{"a": 1, "b": "x"}'; None if it is not a literal keyword call."""
    try:
        node = ast.parse(source, mode="eval").body
    except SyntaxError:
        return None
    if not isinstance(node, ast.Call) or node.args:
        return None
    try:
        args = {kw.arg: ast.literal_eval(kw.value) for kw in node.keywords if kw.arg is not None}
        return dumps(args) if len(args) == len(node.keywords) else None
    except (ValueError, TypeError, SyntaxError, RecursionError):
        return None

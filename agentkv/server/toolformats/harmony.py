"""gpt-oss harmony: the output is messages, each `<|channel|>CHANNEL[ to=functions.NAME]
[ <|constrain|>json]<|message|>BODY` ended by `<|end|>`, `<|call|>` or `<|return|>`, later ones
opened by `<|start|>assistant`. `analysis` is reasoning, `final` (and a `commentary`
preamble) is content, and a message addressed `to=functions.NAME` is a call whose body is
its JSON arguments -- on any channel, so a call made while reasoning is still a call."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from agentkv.server.toolformats.base import (
    Call,
    CallGrammar,
    ParseContext,
    Scan,
    Text,
    ToolFormat,
    json_prefix,
    parameters,
    partial_marker_len,
    tool_name,
)

START, CHANNEL, MESSAGE = "<|start|>", "<|channel|>", "<|message|>"
ENDS = ("<|end|>", "<|call|>", "<|return|>")
_HEADS = (START, CHANNEL)
_CHANNEL = re.compile(r"<\|channel\|>\s*(\w+)")
_RECIPIENT = re.compile(r"to=(?:functions\.)?([^\s<]+)")


class HarmonyFormat(ToolFormat):
    name = "harmony"
    trigger = "<|channel|>commentary to="
    handles_reasoning = True
    stop_markers = ("<|call|>", "<|return|>")

    def scan(self, text: str, final: bool, ctx: ParseContext) -> Scan:
        items: list[Text | Call] = []
        pos = 0
        while pos < len(text):
            head = min((p for m in _HEADS if (p := text.find(m, pos)) >= 0), default=-1)
            if head != pos:  # plain text up to the next header
                stop = len(text) if head < 0 else head
                keep = 0 if final or head >= 0 else partial_marker_len(text[pos:stop], _HEADS)
                _add(items, "content", text[pos : stop - keep])
                pos = stop - keep
                if head < 0:
                    return Scan(items, pos, [])
                continue
            body_at = text.find(MESSAGE, pos)
            if body_at < 0:
                if not final:
                    return Scan(items, pos, [])
                _add(items, "content", text[pos:])
                return Scan(items, len(text), [])
            step = self._message(text, pos, body_at + len(MESSAGE), final, ctx, items)
            if isinstance(step, Scan):
                return step
            pos = step
        return Scan(items, pos, [])

    def _message(
        self, text: str, pos: int, body_at: int, final: bool, ctx: ParseContext, items: list[Text | Call]
    ) -> int | Scan:
        """Read the message whose header is text[pos:body_at]: where the next one starts,
        or the Scan to return when the message is still being written."""
        header = text[pos:body_at]
        ends = [(p, m) for m in ENDS if (p := text.find(m, body_at)) >= 0]
        stop, marker = min(ends) if ends else (len(text), "")
        recipient = _RECIPIENT.search(header)
        if recipient is not None:
            name = recipient.group(1)
            args, _ = json_prefix(text[body_at:stop])
            if not ctx.known(name) or not args.startswith("{"):
                if not ends and not final:
                    return Scan(items, pos, [])
                _add(items, "content", text[pos : stop + len(marker)])
            elif not ends and not final:
                return Scan(items, pos, [Call(name, args)])
            else:
                items.append(Call(name, args))
            return stop + len(marker)
        channel = _CHANNEL.search(header)
        kind = "reasoning" if channel is not None and channel.group(1) == "analysis" else "content"
        if not ends and not final:
            keep = partial_marker_len(text[body_at:], ENDS)
            _add(items, kind, text[body_at : len(text) - keep])
            return Scan(items, len(text) - keep, [], carry=header)
        _add(items, kind, text[body_at:stop])
        return stop + len(marker)

    def grammar(self, tools: Sequence[dict[str, Any]]) -> CallGrammar:
        """A call ends the turn (`<|call|>` is a stop token), so the grammar ends with its JSON."""
        calls = [[("lit", _call_header(tool_name(t))), ("json", parameters(t))] for t in tools]
        return CallGrammar("", calls, "<|call|><|start|>assistant", "")

    def render_calls(self, calls: Sequence[tuple[str, str]]) -> str:
        return START.join(
            ("assistant" if i else "") + f"{CHANNEL}commentary to=functions.{n} <|constrain|>json{MESSAGE}{a}<|call|>"
            for i, (n, a) in enumerate(calls)
        )


def _call_header(name: str) -> str:
    return f"{CHANNEL}commentary to=functions.{name} <|constrain|>json{MESSAGE}"


def _add(items: list[Text | Call], kind: str, text: str) -> None:
    if text:
        items.append(Text(kind, text))  # type: ignore[arg-type]

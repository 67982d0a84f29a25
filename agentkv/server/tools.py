"""Hermes/Qwen `<tool_call>{json}</tool_call>` calls through the old entry points: the parser
every API used before the per-family formats (toolformats/) and the writer the tool-unaware
template fallback (chat.py) uses. Kept as a thin face over toolformats' Hermes format."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from agentkv.server.toolformats.base import ParseContext, partial_marker_len
from agentkv.server.toolformats.hermes import HermesFormat
from agentkv.server.toolformats.stream import CallLog, CallStream, ParsedCall, parse_whole

OPEN_TAG = "<tool_call>"
CLOSE_TAG = "</tool_call>"
__all__ = ["ParsedCall", "StreamEvent", "ToolCallStreamParser", "parse_tool_calls", "render_tool_call"]


class StreamEvent(NamedTuple):
    """One delta: `content` text; or for the call at `index`, its start (`call` with id and
    name, empty arguments) and then argument fragments (`arguments`)."""

    content: str | None = None
    call: ParsedCall | None = None
    index: int = 0
    arguments: str | None = None


def partial_tag_len(text: str, tag: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of `tag`."""
    return partial_marker_len(text, (tag,))


def parse_tool_calls(
    text: str, names: frozenset[str] | None = None, max_calls: int | None = None
) -> tuple[str | None, list[ParsedCall]]:
    """Split a finished completion into (content, calls). A block that does not parse, or
    names a function not in `names`, stays in the content verbatim; calls past `max_calls`
    are dropped."""
    content, calls = parse_whole(HermesFormat(), text, ParseContext(names), max_calls)
    if calls:
        content = content.strip()
    return (content or None), calls


@dataclass(slots=True)
class ToolCallStreamParser:
    """Feed deltas; get StreamEvents (mutates). `calls` holds the calls parsed so far."""

    names: frozenset[str] | None = None
    max_calls: int | None = None
    _stream: CallStream = field(init=False)

    def __post_init__(self) -> None:
        self._stream = CallStream(HermesFormat(), ParseContext(self.names), CallLog(self.max_calls))

    @property
    def calls(self) -> list[ParsedCall]:
        return self._stream.log.calls

    def feed(self, delta: str) -> list[StreamEvent]:
        return _events(self._stream.feed(delta))

    def finish(self) -> list[StreamEvent]:
        return _events(self._stream.finish())


def _events(events: list[Any]) -> list[StreamEvent]:
    out = []
    for e in events:
        if e.kind == "content":
            out.append(StreamEvent(content=e.text))
        elif e.kind == "call":
            out.append(StreamEvent(call=e.call, index=e.index))
        else:
            out.append(StreamEvent(index=e.index, arguments=e.text))
    return out


def render_tool_call(name: str, arguments: str | dict[str, Any]) -> str:
    """How an assistant tool call is written back into a Hermes-style transcript."""
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            pass
    payload = json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)
    return f"{OPEN_TAG}\n{payload}\n{CLOSE_TAG}"

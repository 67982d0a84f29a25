"""Tool calls in the model's own text (Hermes/Qwen `<tool_call>{json}</tool_call>`): the one
parser every API uses, for a finished completion and incrementally for a stream (content
deltas, then per call its id and name first and its arguments as fragments), never leaking a
half-written tag."""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any, NamedTuple

OPEN_TAG = "<tool_call>"
CLOSE_TAG = "</tool_call>"


class ParsedCall(NamedTuple):
    id: str
    name: str
    arguments: str  # JSON text, as OpenAI sends it


class StreamEvent(NamedTuple):
    """One delta: `content` text; or for the call at `index`, its start (`call` with id and
    name, empty arguments) and then argument fragments (`arguments`), whose concatenation is
    the call's `arguments` in the whole parse."""

    content: str | None = None
    call: ParsedCall | None = None
    index: int = 0
    arguments: str | None = None


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


# `{"name": "<name>", "arguments": ` -- the head a call's arguments follow.
_HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*"([^"\\]*)"\s*,\s*"(?:arguments|parameters)"\s*:\s*')
_DECODER = json.JSONDecoder()


def _raw_arguments(body: str) -> tuple[str, str] | None:
    """(name, the arguments' JSON text exactly as written), when the body is name-first."""
    head = _HEAD.match(body)
    if head is None:
        return None
    try:
        value, end = _DECODER.raw_decode(body, head.end())
    except json.JSONDecodeError:
        return None
    if not isinstance(value, dict) or body[end:].strip() != "}":
        return None
    return head.group(1), body[head.end() : end]


def parse_call_json(body: str) -> ParsedCall | None:
    """`{"name": ..., "arguments": {...}}` (or `parameters`) -> ParsedCall; None if malformed.
    Name-first bodies keep their arguments text as written, so streamed fragments add up to it."""
    raw = _raw_arguments(body)
    if raw is not None:
        return ParsedCall(new_call_id(), raw[0], raw[1])
    try:
        obj = json.loads(body.strip())
    except json.JSONDecodeError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args: Any = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):
        try:
            json.loads(args)
        except json.JSONDecodeError:
            return None
        arguments = args
    else:
        arguments = json.dumps(args, ensure_ascii=False)
    return ParsedCall(new_call_id(), obj["name"], arguments)


def parse_tool_calls(
    text: str, names: frozenset[str] | None = None, max_calls: int | None = None
) -> tuple[str | None, list[ParsedCall]]:
    """Split a finished completion into (content, calls). Text outside the tags is content; a
    block whose JSON does not parse, or that names a function not in `names`, stays in the
    content verbatim, so nothing is lost; calls past `max_calls` are dropped."""
    parser = ToolCallStreamParser(names=names, max_calls=max_calls)
    events = parser.feed(text) + parser.finish()
    content = "".join(e.content for e in events if e.content)
    calls = parser.calls
    if calls:
        content = content.strip()
    return (content or None), calls


def partial_tag_len(text: str, tag: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of `tag`."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0


@dataclass(slots=True)
class ToolCallStreamParser:
    """Feed deltas; get events. Mutates its buffer and `calls`.

    Outside a call, text is released at once except a trailing fragment that could begin
    `<tool_call>`. Inside a call, once `{"name": "<known tool>", "arguments": ` has arrived the
    call starts (id and name), and the arguments stream as fragments up to their closing brace.
    A body that is not name-first is held to `</tool_call>` and released whole."""

    names: frozenset[str] | None = None
    max_calls: int | None = None
    buffer: str = ""
    inside: bool = False
    calls: list[ParsedCall] = field(default_factory=list)
    _open: ParsedCall | None = None  # the call being streamed
    _args_start: int = 0  # where its arguments begin in `buffer`
    _sent: int = 0  # argument characters already released

    def feed(self, delta: str) -> list[StreamEvent]:
        self.buffer += delta
        out: list[StreamEvent] = []
        while True:
            if not self.inside:
                if not self._release_content(out):
                    break
            elif not self._release_call(out):
                break
        return out

    def _release_content(self, out: list[StreamEvent]) -> bool:
        pos = self.buffer.find(OPEN_TAG)
        if pos < 0:
            keep = partial_tag_len(self.buffer, OPEN_TAG)
            text, self.buffer = self.buffer[: len(self.buffer) - keep], self.buffer[len(self.buffer) - keep :]
            if text:
                out.append(StreamEvent(content=text))
            return False
        if pos > 0:
            out.append(StreamEvent(content=self.buffer[:pos]))
        self.buffer = self.buffer[pos + len(OPEN_TAG) :]
        self.inside = True
        return True

    def _room(self) -> bool:
        return self.max_calls is None or len(self.calls) < self.max_calls

    def _known(self, name: str) -> bool:
        return self.names is None or name in self.names

    def _release_call(self, out: list[StreamEvent]) -> bool:
        pos = self.buffer.find(CLOSE_TAG)
        body = self.buffer if pos < 0 else self.buffer[:pos]
        self._stream_arguments(body, out)
        if pos < 0:
            return False
        self.buffer = self.buffer[pos + len(CLOSE_TAG) :]
        self.inside = False
        self._close(body, out, closed=True)
        return True

    def _stream_arguments(self, body: str, out: list[StreamEvent]) -> None:
        """Start the call once its head is in, then release what has come of its arguments:
        all of it while the object is incomplete, exactly to its end once it parses."""
        if self._open is None:
            head = _HEAD.match(body)
            if (
                head is None
                or body[head.end() : head.end() + 1] != "{"
                or not self._known(head.group(1))
                or not self._room()
            ):
                return
            self._open = ParsedCall(new_call_id(), head.group(1), "")
            self._args_start, self._sent = head.end(), 0
            out.append(StreamEvent(call=self._open, index=len(self.calls)))
        text = body[self._args_start :]
        try:
            _, end = _DECODER.raw_decode(text)
            text = text[:end]
        except json.JSONDecodeError:
            pass
        if len(text) > self._sent:
            out.append(StreamEvent(index=len(self.calls), arguments=text[self._sent :]))
            self._sent = len(text)

    def _close(self, body: str, out: list[StreamEvent], *, closed: bool) -> None:
        call = parse_call_json(body)
        started, self._open = self._open, None
        if started is not None:
            # Already announced: it counts, with the arguments as streamed.
            self.calls.append(started._replace(arguments=body[self._args_start :][: self._sent]))
            return
        if call is not None and not self._room():
            return
        if call is None or not self._known(call.name):
            out.append(StreamEvent(content=OPEN_TAG + body + (CLOSE_TAG if closed else "")))
            return
        out.append(StreamEvent(call=call, index=len(self.calls)))
        self.calls.append(call)

    def finish(self) -> list[StreamEvent]:
        """End of stream: an unterminated call still counts if its JSON is whole (the model
        may stop on EOS right after the JSON); anything else held back is content."""
        out: list[StreamEvent] = []
        if self.inside:
            self._stream_arguments(self.buffer, out)
            self.inside = False
            self._close(self.buffer, out, closed=False)
        elif self.buffer:
            out.append(StreamEvent(content=self.buffer))
        self.buffer = ""
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

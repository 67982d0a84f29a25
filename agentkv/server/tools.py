"""Tool calls in the model's own text (Hermes/Qwen `<tool_call>{json}</tool_call>`): parsing a
finished completion into OpenAI `tool_calls`, and an incremental parser that turns streamed
text into content deltas and tool-call deltas without ever leaking a half-written tag."""
from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any, NamedTuple

OPEN_TAG = "<tool_call>"
CLOSE_TAG = "</tool_call>"


class ParsedCall(NamedTuple):
    id: str
    name: str
    arguments: str  # JSON text, as OpenAI sends it


class StreamEvent(NamedTuple):
    """One delta: `content` text, or a whole tool call at `index` (id + name + arguments)."""

    content: str | None = None
    call: ParsedCall | None = None
    index: int = 0


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def parse_call_json(body: str) -> ParsedCall | None:
    """`{"name": ..., "arguments": {...}}` (or `parameters`) -> ParsedCall; None if malformed."""
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


def parse_tool_calls(text: str) -> tuple[str | None, list[ParsedCall]]:
    """Split a finished completion into (content, calls). Text outside the tags is content; a
    block whose JSON does not parse stays in the content verbatim, so nothing is lost."""
    parser = ToolCallStreamParser()
    events = parser.feed(text) + parser.finish()
    content = "".join(e.content for e in events if e.content)
    calls = [e.call for e in events if e.call is not None]
    if calls:
        content = content.strip()
    return (content or None), calls


def _partial_tag_len(text: str, tag: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of `tag`."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0


@dataclass(slots=True)
class ToolCallStreamParser:
    """Feed cumulative deltas; get events. Mutates its buffer.

    Outside a call, text is released at once except a trailing fragment that could begin
    `<tool_call>`. Inside a call the body is held until `</tool_call>`, then released as one
    tool-call delta (id, name and the full arguments), which OpenAI clients accumulate fine."""

    buffer: str = ""
    inside: bool = False
    num_calls: int = 0

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
            keep = _partial_tag_len(self.buffer, OPEN_TAG)
            text, self.buffer = self.buffer[:len(self.buffer) - keep], self.buffer[len(self.buffer) - keep:]
            if text:
                out.append(StreamEvent(content=text))
            return False
        if pos > 0:
            out.append(StreamEvent(content=self.buffer[:pos]))
        self.buffer = self.buffer[pos + len(OPEN_TAG):]
        self.inside = True
        return True

    def _release_call(self, out: list[StreamEvent]) -> bool:
        pos = self.buffer.find(CLOSE_TAG)
        if pos < 0:
            return False
        body, self.buffer = self.buffer[:pos], self.buffer[pos + len(CLOSE_TAG):]
        self.inside = False
        out.append(self._call_or_text(body, closed=True))
        return True

    def _call_or_text(self, body: str, *, closed: bool) -> StreamEvent:
        call = parse_call_json(body)
        if call is None:
            tail = CLOSE_TAG if closed else ""
            return StreamEvent(content=OPEN_TAG + body + tail)
        self.num_calls += 1
        return StreamEvent(call=call, index=self.num_calls - 1)

    def finish(self) -> list[StreamEvent]:
        """End of stream: an unterminated call still counts if its JSON is whole (the model
        may stop on EOS right after the JSON); anything else held back is content."""
        rest, self.buffer = self.buffer, ""
        if self.inside:
            self.inside = False
            return [self._call_or_text(rest, closed=False)]
        return [StreamEvent(content=rest)] if rest else []


def render_tool_call(name: str, arguments: str | dict[str, Any]) -> str:
    """How an assistant tool call is written back into a Hermes-style transcript."""
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            pass
    payload = json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)
    return f"{OPEN_TAG}\n{payload}\n{CLOSE_TAG}"

"""Incremental reading of a format's text: feed deltas, get events -- text, then per call its
start (id and name) and argument fragments that add up to the arguments of the whole parse.
Several streams (the reasoning part and the content part of one output) share one CallLog,
so call indices run on across them and `max_calls` counts them all."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, NamedTuple

from agentkv.server.toolformats.base import Call, ParseContext, Text, TextKind, ToolFormat

EventKind = Literal["reasoning", "content", "call", "arguments"]


class ParsedCall(NamedTuple):
    id: str
    name: str
    arguments: str  # JSON text, as OpenAI sends it


class OutputEvent(NamedTuple):
    """`reasoning`/`content` text; a tool call's start (`call`: id and name) or an arguments
    fragment for the call at `index` (fragments add up to the parsed arguments)."""

    kind: EventKind
    text: str = ""
    call: ParsedCall | None = None
    index: int = 0


@dataclass(slots=True)
class CallLog:
    """The calls of one output so far (mutated by the streams that share it)."""

    max_calls: int | None = None
    calls: list[ParsedCall] = field(default_factory=list)

    def room(self) -> bool:
        return self.max_calls is None or len(self.calls) < self.max_calls


@dataclass(slots=True)
class _Open:
    """A call announced while its block is still being written."""

    index: int | None  # its place in the CallLog; None: past max_calls, dropped silently
    sent: str  # arguments released so far


@dataclass(slots=True)
class CallStream:
    """Feed text deltas of one part of an output (`text_kind` says what its plain text is);
    get OutputEvents. Mutates its buffer and the shared log."""

    fmt: ToolFormat
    ctx: ParseContext
    log: CallLog
    text_kind: TextKind = "content"
    buffer: str = ""
    _open: list[_Open] = field(default_factory=list)

    def feed(self, delta: str) -> list[OutputEvent]:
        self.buffer += delta
        return self._step(final=False)

    def finish(self) -> list[OutputEvent]:
        """End of output: everything held back is decided now."""
        return self._step(final=True)

    def _step(self, final: bool) -> list[OutputEvent]:
        scan = self.fmt.scan(self.buffer, final, self.ctx)
        out: list[OutputEvent] = []
        num_matched = 0
        for item in scan.items:
            if isinstance(item, Text):
                kind = "reasoning" if item.kind == "reasoning" or self.text_kind == "reasoning" else "content"
                out.append(OutputEvent(kind, item.text))
                continue
            opened = self._open[num_matched] if num_matched < len(self._open) else None
            num_matched += opened is not None
            self._release(item, opened, out, done=True)
        self.buffer = scan.carry + self.buffer[scan.consumed :]
        if scan.consumed:
            self._open = []
        elif num_matched:
            raise RuntimeError(f"{self.fmt.name}: calls decided without consuming text (format bug)")
        for i, call in enumerate(scan.open_calls):
            self._release(call, self._open[i] if i < len(self._open) else None, out, done=False)
        return out

    def _release(self, call: Call, opened: _Open | None, out: list[OutputEvent], *, done: bool) -> None:
        """Announce `call` (unless `opened` did), then send its arguments not yet sent."""
        if opened is None:
            index = len(self.log.calls) if self.log.room() else None
            if index is not None:
                call_id = call.call_id or self.fmt.new_call_id()
                if any(c.id == call_id for c in self.log.calls):  # ids the model wrote twice (Kimi's)
                    call_id = f"{call_id}-{index}"
                self.log.calls.append(ParsedCall(call_id, call.name, ""))
                out.append(OutputEvent("call", call=self.log.calls[index], index=index))
            opened = _Open(index, "")
            if not done:
                self._open.append(opened)
        if not call.arguments.startswith(opened.sent):
            raise RuntimeError(f"{self.fmt.name}: arguments {call.arguments!r} do not extend {opened.sent!r} (bug)")
        fragment = call.arguments[len(opened.sent) :]
        opened.sent = call.arguments
        if opened.index is None or not fragment:
            return
        entry = self.log.calls[opened.index]
        self.log.calls[opened.index] = entry._replace(arguments=call.arguments)
        out.append(OutputEvent("arguments", fragment, index=opened.index))


def parse_whole(
    fmt: ToolFormat, text: str, ctx: ParseContext, max_calls: int | None = None
) -> tuple[str, list[ParsedCall]]:
    """(content, calls) of a finished text, through the same stream a delta feed uses."""
    stream = CallStream(fmt, ctx, CallLog(max_calls))
    events = stream.feed(text) + stream.finish()
    return "".join(e.text for e in events if e.kind == "content"), stream.log.calls

"""The one reading of a model's output every API shares: reasoning (`<think>` blocks) split
off first, then tool calls parsed out of what is left. Each API maps the same events to its
own wire format (chat deltas, Anthropic content blocks, Responses output items)."""

from __future__ import annotations

from typing import Literal, NamedTuple

from agentkv.server.reasoning import ReasoningStreamParser
from agentkv.server.tool_policy import ToolPolicy
from agentkv.server.tools import ParsedCall, ToolCallStreamParser

EventKind = Literal["reasoning", "content", "call", "arguments"]


class OutputEvent(NamedTuple):
    """`reasoning`/`content` text; a tool call's start (`call`: id and name) or an arguments
    fragment for the call at `index` (fragments add up to the parsed arguments)."""

    kind: EventKind
    text: str = ""
    call: ParsedCall | None = None
    index: int = 0


class OutputSpec(NamedTuple):
    """How one request's output is read."""

    policy: ToolPolicy | None  # None or a policy that parses nothing: no tool parsing
    reasoning: bool = False  # the template writes <think> blocks
    starts_inside: bool = False  # the prompt opened one


class OutputParser:
    """Feed text deltas, get events (mutates). `calls` holds the calls parsed so far."""

    def __init__(self, spec: OutputSpec) -> None:
        self._think = ReasoningStreamParser(inside=spec.starts_inside) if spec.reasoning else None
        policy = spec.policy
        self._tools = (
            ToolCallStreamParser(names=policy.names, max_calls=policy.max_calls)
            if policy is not None and policy.parse
            else None
        )

    @property
    def calls(self) -> list[ParsedCall]:
        return self._tools.calls if self._tools is not None else []

    def feed(self, delta: str) -> list[OutputEvent]:
        if self._think is None:
            return self._content(delta, final=False)
        split = self._think.feed(delta)
        return self._reasoning(split.reasoning) + self._content(split.content, final=False)

    def finish(self) -> list[OutputEvent]:
        if self._think is None:
            return self._content("", final=True)
        split = self._think.finish()
        return self._reasoning(split.reasoning) + self._content(split.content, final=True)

    @staticmethod
    def _reasoning(text: str) -> list[OutputEvent]:
        return [OutputEvent("reasoning", text)] if text else []

    def _content(self, text: str, *, final: bool) -> list[OutputEvent]:
        if self._tools is None:
            return [OutputEvent("content", text)] if text else []
        raw = self._tools.feed(text) + (self._tools.finish() if final else [])
        out = []
        for event in raw:
            if event.content:
                out.append(OutputEvent("content", event.content))
            elif event.call is not None:
                out.append(OutputEvent("call", call=event.call, index=event.index))
            elif event.arguments:
                out.append(OutputEvent("arguments", event.arguments, index=event.index))
        return out


class ParsedOutput(NamedTuple):
    reasoning: str | None
    content: str | None
    calls: list[ParsedCall]


def parse_output(text: str, spec: OutputSpec) -> ParsedOutput:
    """A finished output read whole; the same events a stream gets, joined."""
    parser = OutputParser(spec)
    events = parser.feed(text) + parser.finish()
    reasoning = "".join(e.text for e in events if e.kind == "reasoning")
    content = "".join(e.text for e in events if e.kind == "content")
    if parser.calls:
        content = content.strip()
    parses_tools = spec.policy is not None and spec.policy.parse
    return ParsedOutput(reasoning or None, (content or None) if parses_tools else content, parser.calls)

"""The one reading of a model's output every API shares: reasoning split off first (the
family's tags, or harmony's channels inside its format), then tool calls parsed out of both
parts by the model's own format -- a call begun while reasoning is still a call. Each API
maps the same events to its own wire format (chat deltas, Anthropic content blocks,
Responses output items)."""

from __future__ import annotations

from typing import Any, NamedTuple

from agentkv.server.reasoning import REASONING_TAGS, ReasoningStreamParser, prompt_opens_thinking
from agentkv.server.tool_policy import ToolPolicy
from agentkv.server.toolformats.base import ParseContext, ToolFormat
from agentkv.server.toolformats.registry import get_format
from agentkv.server.toolformats.stream import CallLog, CallStream, EventKind, OutputEvent, ParsedCall

__all__ = ["EventKind", "OutputEvent", "OutputParser", "OutputSpec", "ParsedOutput", "output_spec", "parse_output"]


class OutputSpec(NamedTuple):
    """How one request's output is read."""

    policy: ToolPolicy | None  # None or a policy that parses nothing: no tool parsing
    reasoning: bool | str = False  # a reasoning parser name ("think", "mistral"); True = "think"
    starts_inside: bool = False  # the prompt opened a reasoning block
    tool_format: ToolFormat | None = None  # None: Hermes

    @property
    def parses_tools(self) -> bool:
        return self.policy is not None and self.policy.parse

    @property
    def keeps_special_tokens(self) -> bool:
        """Whether the output text must keep special tokens: tool markers, harmony's channels."""
        return self.parses_tools or (self.tool_format is not None and self.tool_format.handles_reasoning)


def output_spec(policy: ToolPolicy | None, choice: Any, prompt: str) -> OutputSpec:
    """The spec for a prompt rendered for a model whose formats are `choice` (a Choice)."""
    fmt = get_format(choice.tool_format)
    tags = REASONING_TAGS.get(choice.reasoning)
    inside = tags is not None and prompt_opens_thinking(prompt, *tags)
    return OutputSpec(policy, choice.reasoning if tags else False, inside, fmt)


class OutputParser:
    """Feed text deltas, get events (mutates). `calls` holds the calls parsed so far."""

    def __init__(self, spec: OutputSpec) -> None:
        name = "think" if spec.reasoning is True else spec.reasoning
        tags = REASONING_TAGS.get(name) if name else None
        self._think = ReasoningStreamParser(spec.starts_inside, "", *tags) if tags else None
        fmt = spec.tool_format or get_format("hermes")
        policy = spec.policy
        self._log = CallLog(policy.max_calls if policy is not None else None)
        self._content: CallStream | None = None
        self._thought: CallStream | None = None
        if spec.parses_tools:
            ctx = ParseContext.of_tools(policy.tools, policy.names)  # type: ignore[union-attr]
            self._content = CallStream(fmt, ctx, self._log)
            self._thought = CallStream(fmt, ctx, self._log, "reasoning") if tags else None
        elif fmt.handles_reasoning:  # its channels still split reasoning from content
            self._content = CallStream(fmt, ParseContext(frozenset()), self._log)

    @property
    def calls(self) -> list[ParsedCall]:
        return self._log.calls

    def feed(self, delta: str) -> list[OutputEvent]:
        if self._think is None:
            return self._part(self._content, "content", delta, final=False)
        split = self._think.feed(delta)
        return self._part(self._thought, "reasoning", split.reasoning, final=False) + self._part(
            self._content, "content", split.content, final=False
        )

    def finish(self) -> list[OutputEvent]:
        if self._think is None:
            return self._part(self._content, "content", "", final=True)
        split = self._think.finish()
        return self._part(self._thought, "reasoning", split.reasoning, final=True) + self._part(
            self._content, "content", split.content, final=True
        )

    @staticmethod
    def _part(stream: CallStream | None, kind: EventKind, text: str, *, final: bool) -> list[OutputEvent]:
        if stream is None:
            return [OutputEvent(kind, text)] if text else []
        events = stream.feed(text) if text else []
        return events + (stream.finish() if final else [])


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
    return ParsedOutput(reasoning or None, (content or None) if spec.parses_tools else content, parser.calls)

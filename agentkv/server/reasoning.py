"""Reasoning text in `<think>...</think>` blocks (Qwen3, DeepSeek-R1, GLM) or Mistral's
`[THINK]...[/THINK]`: split out of the model's output into `reasoning_content`, whole or
incrementally for a stream, so the content never holds the model's thoughts. (Harmony's
analysis channel is read by its tool format, toolformats/harmony.py.)

A template that opens the block in its generation prompt (the prompt ends with `<think>`)
starts the output inside it; otherwise the output starts outside and may open a block."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

from agentkv.server.toolformats.base import partial_marker_len

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"
# reasoning parser name -> (open tag, close tag)
REASONING_TAGS = {"think": (THINK_OPEN, THINK_CLOSE), "mistral": ("[THINK]", "[/THINK]")}


class ReasoningSplit(NamedTuple):
    reasoning: str
    content: str


def template_thinks(template: Any) -> bool:
    """Whether a chat template writes `<think>` blocks at all (its text mentions the tag)."""
    return THINK_OPEN in (getattr(template, "source", "") or "")


def prompt_opens_thinking(prompt: str, open_tag: str = THINK_OPEN, close_tag: str = THINK_CLOSE) -> bool:
    """Whether the rendered prompt leaves the model inside a reasoning block."""
    tail = prompt.rstrip()
    return tail.endswith(open_tag) or tail.rfind(open_tag) > tail.rfind(close_tag)


@dataclass(slots=True)
class ReasoningStreamParser:
    """Feed text deltas, get (reasoning, content) pieces. Mutates its buffer and state.

    A trailing fragment that could begin the next tag is held back, so neither part ever
    shows half a tag; the tags themselves appear in neither part."""

    inside: bool = False
    buffer: str = ""
    open_tag: str = THINK_OPEN
    close_tag: str = THINK_CLOSE

    def feed(self, delta: str) -> ReasoningSplit:
        self.buffer += delta
        reasoning, content = [], []
        while True:
            tag = self.close_tag if self.inside else self.open_tag
            pos = self.buffer.find(tag)
            if pos < 0:
                keep = partial_marker_len(self.buffer, (tag,))
                cut = len(self.buffer) - keep
                (reasoning if self.inside else content).append(self.buffer[:cut])
                self.buffer = self.buffer[cut:]
                break
            (reasoning if self.inside else content).append(self.buffer[:pos])
            self.buffer = self.buffer[pos + len(tag) :]
            self.inside = not self.inside
        return ReasoningSplit("".join(reasoning), "".join(content))

    def finish(self) -> ReasoningSplit:
        """End of output: whatever was held back belongs to the part it was in."""
        rest, self.buffer = self.buffer, ""
        return ReasoningSplit(rest, "") if self.inside else ReasoningSplit("", rest)


def split_reasoning(text: str, starts_inside: bool) -> ReasoningSplit:
    """(reasoning, content) of a finished output."""
    parser = ReasoningStreamParser(inside=starts_inside)
    a, b = parser.feed(text), parser.finish()
    return ReasoningSplit(a.reasoning + b.reasoning, a.content + b.content)

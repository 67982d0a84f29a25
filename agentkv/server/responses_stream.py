"""The Responses API's event stream: the shared output reader's events (reasoning, content,
a tool call's start, argument fragments) become output items, each opened and closed with
its own numbered events (`response.output_item.added`, `…content_part.added`,
`…output_text.delta` / `…function_call_arguments.delta`, the `….done` events)."""

from __future__ import annotations

from typing import Any

from agentkv.server.output_parser import OutputEvent
from agentkv.server.responses_objects import (
    EventWriter,
    FunctionCallOut,
    OutputItem,
    OutputMessage,
    OutputText,
    ReasoningOut,
    ReasoningText,
    item_id,
)


class OutputItems:
    """The open output item of a stream (mutates): a message, a reasoning item or a function
    call, one at a time. `done` holds the finished items in output order. Leading whitespace
    of a message is held until real text follows, so a tool call's preamble newline makes no
    empty message (the whole parse strips it the same way)."""

    def __init__(self, write: EventWriter) -> None:
        self.write = write
        self.done: list[OutputItem] = []
        self.kind, self.held, self.text, self.id = "", "", "", ""
        self.call: Any = None

    @property
    def index(self) -> int:
        return len(self.done)

    def feed(self, ev: OutputEvent) -> list[str]:
        if ev.kind == "content":
            text = self.held + ev.text
            if self.kind != "message" and not text.strip():
                self.held = text
                return []
            self.held = ""
            frames = [] if self.kind == "message" else self._open_message()
            return frames + self._delta(text)
        if ev.kind == "reasoning":
            frames = [] if self.kind == "reasoning" else self._open_reasoning()
            return frames + self._delta(ev.text)
        if ev.kind == "call":
            self.held = ""
            frames = self.close() + self._open_call(ev.call)
            return frames + (self._delta(ev.call.arguments) if ev.call.arguments else [])
        return self._delta(ev.text) if ev.text else []

    def finish(self, incomplete: bool) -> list[str]:
        """Close the open item; an output that was only whitespace is still one message."""
        if not self.done and not self.kind and self.held:
            frames = self._open_message() + self._delta(self.held)
            self.held = ""
            return frames + self.close(incomplete)
        return self.close(incomplete)

    def _open_message(self) -> list[str]:
        return self._open("message", "msg", OutputMessage, OutputText)

    def _open_reasoning(self) -> list[str]:
        return self._open("reasoning", "rs", ReasoningOut, ReasoningText)

    def _open(self, kind: str, id_prefix: str, item_type: type, part_type: type) -> list[str]:
        """A new output item of `kind` and its first, empty content part."""
        frames = self._start(kind, item_id(id_prefix))
        item = item_type(id=self.id, status="in_progress", content=[])
        return frames + [
            self.write("response.output_item.added", output_index=self.index, item=item.model_dump()),
            self.write(
                "response.content_part.added",
                item_id=self.id,
                output_index=self.index,
                content_index=0,
                part=part_type(text="").model_dump(),
            ),
        ]

    def _open_call(self, call: Any) -> list[str]:
        self.kind, self.text, self.id, self.call = "function_call", "", item_id("fc"), call
        item = FunctionCallOut(id=self.id, call_id=call.id, name=call.name, arguments="", status="in_progress")
        return [self.write("response.output_item.added", output_index=self.index, item=item.model_dump())]

    def _start(self, kind: str, new_id: str) -> list[str]:
        frames = self.close()
        self.kind, self.text, self.id = kind, "", new_id
        return frames

    def _delta(self, text: str) -> list[str]:
        self.text += text
        where = {"item_id": self.id, "output_index": self.index}
        if self.kind == "function_call":
            return [self.write("response.function_call_arguments.delta", delta=text, **where)]
        if self.kind == "reasoning":
            return [self.write("response.reasoning_text.delta", content_index=0, delta=text, **where)]
        return [self.write("response.output_text.delta", content_index=0, delta=text, logprobs=[], **where)]

    def close(self, incomplete: bool = False) -> list[str]:
        """Close the open item (if any) with its `….done` events; it joins `done`."""
        if not self.kind:
            return []
        where = {"item_id": self.id, "output_index": self.index}
        status = "incomplete" if incomplete else "completed"
        if self.kind == "function_call":
            item: OutputItem = FunctionCallOut(
                id=self.id, call_id=self.call.id, name=self.call.name, arguments=self.text, status="completed"
            )
            frames = [self.write("response.function_call_arguments.done", arguments=self.text, **where)]
        elif self.kind == "reasoning":
            part = ReasoningText(text=self.text)
            item = ReasoningOut(id=self.id, status=status, content=[part])
            frames = [
                self.write("response.reasoning_text.done", content_index=0, text=self.text, **where),
                self.write("response.content_part.done", content_index=0, part=part.model_dump(), **where),
            ]
        else:
            text = OutputText(text=self.text)
            item = OutputMessage(id=self.id, status=status, content=[text])
            frames = [
                self.write("response.output_text.done", content_index=0, text=self.text, logprobs=[], **where),
                self.write("response.content_part.done", content_index=0, part=text.model_dump(), **where),
            ]
        frames.append(self.write("response.output_item.done", output_index=self.index, item=item.model_dump()))
        self.done.append(item)
        self.kind = ""
        return frames

    def message_text(self) -> str:
        return "".join(part.text for item in self.done if isinstance(item, OutputMessage) for part in item.content)

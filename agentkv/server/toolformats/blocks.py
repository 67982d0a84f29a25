"""The scan most formats share: calls sit in blocks between a begin and an end marker, text
outside them is content, and a block is parsed by the format's body reader. A possible
marker prefix at the end of the buffer is held back, so no half-written marker reaches
content; a block whose first call does not parse is given back as content, whole."""

from __future__ import annotations

from abc import abstractmethod
from typing import NamedTuple

from agentkv.server.toolformats.base import Call, ParseContext, Scan, Text, ToolFormat, partial_marker_len


class Body(NamedTuple):
    """A block body read: its calls in order, and the text after the last call that did not
    parse (content; "" when the whole body was calls)."""

    calls: list[Call]
    rest: str = ""


class BlockFormat(ToolFormat):
    """begin ... end blocks. `end` None: the block runs to the end of the output (Llama's
    `<|python_tag|>`, Mistral's `[TOOL_CALLS]`). `ends` lists every end marker accepted."""

    begin: str = ""
    ends: tuple[str, ...] = ()

    @abstractmethod
    def read_body(self, body: str, ctx: ParseContext, complete: bool) -> Body:
        """Calls in `body`. complete=False: the block is still being written; return only
        calls whose head is whole and valid (the last may have partial arguments, a prefix
        of the final ones), and whatever is returned must stay a call once complete."""

    def find_begin(self, text: str, start: int) -> tuple[int, int]:
        """(where the next block begins, where its body starts), or (-1, -1)."""
        pos = text.find(self.begin, start)
        return (pos, pos + len(self.begin)) if pos >= 0 else (-1, -1)

    def begin_markers(self) -> tuple[str, ...]:
        return (self.begin,)

    def scan(self, text: str, final: bool, ctx: ParseContext) -> Scan:
        items: list[Text | Call] = []
        pos = 0
        while True:
            start, body_start = self.find_begin(text, pos)
            if start < 0:
                keep = 0 if final else partial_marker_len(text[pos:], self.begin_markers())
                _content(items, text[pos : len(text) - keep])
                return Scan(items, len(text) - keep, [])
            _content(items, text[pos:start])
            stop, end_len = self._find_end(text, body_start)
            if stop < 0 and not final:
                body = text[body_start:]
                body = body[: len(body) - partial_marker_len(body, self.ends)]
                return Scan(items, start, self.read_body(body, ctx, complete=False).calls)
            stop = len(text) if stop < 0 else stop
            read = self.read_body(text[body_start:stop], ctx, complete=True)
            if read.calls:
                items += read.calls
                _content(items, read.rest)
            else:
                _content(items, text[start : stop + end_len])
            pos = stop + end_len

    def _find_end(self, text: str, start: int) -> tuple[int, int]:
        found = [(p, len(m)) for m in self.ends if (p := text.find(m, start)) >= 0]
        return min(found) if found else (-1, 0)


def _content(items: list[Text | Call], text: str) -> None:
    if text:
        items.append(Text("content", text))

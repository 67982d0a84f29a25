"""gpt-oss harmony: the output is messages, each `[ to=functions.NAME]<|channel|>CHANNEL[ to=functions.NAME]
[ <|constrain|>json| json]<|message|>BODY` ended by `<|end|>`, `<|call|>` or `<|return|>`, later
ones opened by `<|start|>assistant`. `analysis` is reasoning, `final` (and a `commentary`
preamble) is content, and a message addressed `to=functions.NAME` is a call whose body is its
JSON arguments -- on any channel, so a call made while reasoning is still a call.

Harmony lets the recipient stand in the role header (`<|start|>assistant to=functions.NAME
<|channel|>commentary json`) or in the channel header (`<|channel|>commentary
to=functions.NAME <|constrain|>json`); the model writes either, and the scan reads both. The
first message's role header began in the prompt (`<|start|>assistant`), so its recipient is
text before the first `<|channel|>`. A constrained call is written in the role form because
gpt-oss's chat template renders an earlier call back that way: the tokens generated for a call
are then the very tokens the next request's prompt holds, and the prefix cache covers them."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from agentkv.server.toolformats.base import (
    Call,
    CallGrammar,
    ParseContext,
    Scan,
    Tag,
    Text,
    ToolFormat,
    Triggered,
    json_prefix,
    parameters,
    partial_marker_len,
    tool_name,
)

START, CHANNEL, MESSAGE = "<|start|>", "<|channel|>", "<|message|>"
ENDS = ("<|end|>", "<|call|>", "<|return|>")
ROLE_TRIGGER = " to=functions."  # a call addressed in the role header (what the template renders)
CHANNEL_TRIGGER = "<|channel|>commentary to="  # a call addressed in the channel header
_HEADS = (START, CHANNEL)
_CHANNEL = re.compile(r"<\|channel\|>\s*(\w+)")
_RECIPIENT = re.compile(r"to=(?:functions\.)?([^\s<]+)")
# Plain text that ends in a recipient right before `<|channel|>` is that message's role header.
_ROLE_RECIPIENT = re.compile(r"(?:^|\s+)to=[^\s<]+$")
# Plain text whose end may still grow into such a recipient: held back while streaming.
_PENDING_RECIPIENT = re.compile(r"(?:^|\s+)(?:to?|to=[^\s<]*)?$")


class HarmonyFormat(ToolFormat):
    name = "harmony"
    trigger = ROLE_TRIGGER
    handles_reasoning = True
    stop_markers = ("<|call|>", "<|return|>")

    def scan(self, text: str, final: bool, ctx: ParseContext) -> Scan:
        items: list[Text | Call] = []
        pos = 0
        while pos < len(text):
            head = _next_header(text, pos)
            if head != pos:  # plain text up to the next header
                stop = len(text) if head < 0 else head
                keep = 0 if final or head >= 0 else _pending_len(text[pos:stop])
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
        """A call ends the turn (`<|call|>` is a stop token), so the grammar ends with its JSON.
        Its header is the role form, as the chat template renders the call back."""
        calls = [[("lit", _role_header(tool_name(t))), ("json", parameters(t))] for t in tools]
        return CallGrammar("", calls, f"<|call|>{START}assistant", "")

    def strict_calls(self, tools: Sequence[dict[str, Any]]) -> Triggered:
        """`strict` tools under `auto`: a call opened in either form is held to that form
        from its trigger on (the channel form's trigger completes before the role form's
        ` to=functions.` inside it could)."""
        role: list[Tag] = [(_role_header(tool_name(t)), [("json", parameters(t))], "") for t in tools]
        channel: list[Tag] = [(_channel_header(tool_name(t)), [("json", parameters(t))], "") for t in tools]
        return [ROLE_TRIGGER, CHANNEL_TRIGGER], role + channel

    def render_calls(self, calls: Sequence[tuple[str, str]]) -> str:
        """The calls as the grammar writes them and the template renders them back."""
        return START.join(
            ("assistant" if i else "") + f"{_role_header(n)}{a}<|call|>" for i, (n, a) in enumerate(calls)
        )


def _role_header(name: str) -> str:
    """What follows the prompt's `<|start|>assistant` up to a call's arguments, byte for byte
    what gpt-oss's template writes for an earlier call (`tool_call.content_type` unset)."""
    return f" to=functions.{name}{CHANNEL}commentary json{MESSAGE}"


def _channel_header(name: str) -> str:
    return f"{CHANNEL}commentary to=functions.{name} <|constrain|>json{MESSAGE}"


def _next_header(text: str, pos: int) -> int:
    """Where the next message header starts at or after `pos` (-1: none yet): at `<|start|>`,
    or at `<|channel|>` -- moved back over a recipient the plain text before it ends with."""
    head = min((p for m in _HEADS if (p := text.find(m, pos)) >= 0), default=-1)
    if head > pos and text.startswith(CHANNEL, head):
        recipient = _ROLE_RECIPIENT.search(text[pos:head])
        if recipient is not None:
            return pos + recipient.start()
    return head


def _pending_len(text: str) -> int:
    """Length of the end of plain `text` that may yet open a header: a partial marker, and
    before it whitespace or a recipient still being written (` t`, ` to=functions.ge`)."""
    marker = partial_marker_len(text, _HEADS)
    recipient = _PENDING_RECIPIENT.search(text[: len(text) - marker])
    return marker + (len(text) - marker - recipient.start() if recipient is not None else 0)


def _add(items: list[Text | Call], kind: str, text: str) -> None:
    if text:
        items.append(Text(kind, text))  # type: ignore[arg-type]

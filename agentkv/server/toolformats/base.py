"""The interface every tool-call format implements: what a scan of the model's text yields
(decided text and calls, and the calls of a block still being written), the per-request
context (known names, parameter schemas), and the helpers formats share."""

from __future__ import annotations

import json
import uuid
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any, Literal, NamedTuple

TextKind = Literal["content", "reasoning"]


class Text(NamedTuple):
    """Decided text: `content`, or `reasoning` for formats that carry their own (harmony)."""

    kind: TextKind
    text: str


class Call(NamedTuple):
    """A call as written: its name, its arguments' JSON text, and its id when the format
    writes one (Kimi's `functions.NAME:IDX`, Mistral's `[CALL_ID]`)."""

    name: str
    arguments: str
    call_id: str | None = None


class Scan(NamedTuple):
    """One look at the buffered text.

        buffer: [ decided: items ............ | open block (calls being written) ... ]
                0                      consumed                                     len

    `items` are final; `open_calls` are the calls seen so far in the undecided tail, the last
    one's arguments possibly partial -- but always a prefix of what they will be."""

    items: list[Text | Call]
    consumed: int
    open_calls: list[Call]
    carry: str = ""  # put back before the rest (a message header whose body streams on)


# A piece of a call's grammar: ("lit", text), ("json", a JSON schema), ("ebnf", a rule body)
# or ("regex", a pattern the text must match whole); in strict tags also ("tags", (tags, sep)):
# one or more tags joined by sep, ("star", pieces): zero or more times, ("or", [pieces, ...]).
Piece = tuple[str, Any]
TEXT_VALUE: Piece = ("ebnf", "[^<]*")  # an XML value: any text without a tag in it


class CallGrammar(NamedTuple):
    """What a constrained call may be, in the format's own syntax, as plain data for the
    grammar compiler (runtime/structured.py): `begin`, then one or more calls (each one of
    `calls`, a piece list per tool) joined by `sep`, then `end`."""

    begin: str
    calls: list[list[Piece]]
    sep: str
    end: str


Tag = tuple[str, list[Piece], str]  # (begin, content pieces, end) of one structural tag
Triggered = tuple[list[str], list[Tag]]


def call_tags(plan: CallGrammar) -> list[Tag]:
    """Each call of `plan` as a tag: its opening literal, what follows, its closing literal."""
    tags = []
    for pieces in plan.calls:
        rest = list(pieces[1:])
        end = rest.pop()[1] if len(rest) > 1 and rest[-1][0] == "lit" else ""
        tags.append((pieces[0][1], rest, end))
    return tags


def triggered_calls(plan: CallGrammar, trigger: str) -> Triggered | None:
    """The plan as (triggers, tags) for free text in which a call, once a trigger appears, must
    follow the grammar (`strict` tools under `auto`). Calls opening with `trigger` are a tag
    each; calls in a section (`begin ... end`) make one tag of the whole section, opened by
    `trigger` or the section's marker. None when neither holds."""
    tags = call_tags(plan)
    if plan.begin:
        opener = trigger if trigger and plan.begin.startswith(trigger) else plan.begin
        return [opener], [(plan.begin, [("tags", (tags, plan.sep))], plan.end)]
    if not trigger or not all(begin.startswith(trigger) for begin, _, _ in tags):
        return None
    return [trigger], tags


class ParseContext(NamedTuple):
    """What one request lets the parser accept: tool names (None = any) and their parameter
    schemas, which type the values of XML formats (qwen3-coder, glm)."""

    names: frozenset[str] | None = None
    schemas: dict[str, dict[str, Any]] = {}

    def known(self, name: str) -> bool:
        return bool(name) and (self.names is None or name in self.names)

    @classmethod
    def of_tools(cls, tools: Sequence[dict[str, Any]], names: frozenset[str] | None = None) -> ParseContext:
        schemas = {t["function"]["name"]: t["function"].get("parameters") or {} for t in tools}
        return cls(names, schemas)


class ToolFormat(ABC):
    """A family's way of writing tool calls. Stateless: the stream driver holds the state."""

    name: str = ""
    handles_reasoning: bool = False  # its scan yields Text("reasoning", ...) itself (harmony)
    stop_markers: tuple[str, ...] = ()  # strings that end a call block and the turn (harmony)
    trigger: str = ""  # the text every call opens with, when calls need no section around them

    @abstractmethod
    def scan(self, text: str, final: bool, ctx: ParseContext) -> Scan:
        """Read `text` (the undecided buffer). `final`: no more text will come, so nothing may
        stay open. Pure; never raises on any text."""

    def new_call_id(self) -> str:
        return f"call_{uuid.uuid4().hex[:24]}"

    @abstractmethod
    def grammar(self, tools: Sequence[dict[str, Any]]) -> CallGrammar:
        """The grammar of calls to `tools` (OpenAI tool dicts) written in this format."""

    @abstractmethod
    def render_calls(self, calls: Sequence[tuple[str, str]]) -> str:
        """The assistant text that writes `calls` ((name, arguments JSON) pairs) in this
        format: what a constrained call generates and what history renders back."""

    def strict_calls(self, tools: Sequence[dict[str, Any]]) -> Triggered | None:
        """`strict` tools under `auto`: the triggers that open a call in free text and the
        tags the call must then follow (None: this format decodes them freely)."""
        return triggered_calls(self.grammar(tools), self.trigger)


def partial_marker_len(text: str, markers: Sequence[str]) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of one of `markers`."""
    best = 0
    for marker in markers:
        for n in range(min(len(marker) - 1, len(text)), best, -1):
            if text.endswith(marker[:n]):
                best = n
                break
    return best


# Lenient on raw control characters inside strings, which grammar-constrained JSON may hold.
DECODER = json.JSONDecoder(strict=False)


def json_prefix(text: str) -> tuple[str, bool]:
    """(the JSON value's text so far, whether it is complete): all of `text` (left-trimmed)
    while the value is unfinished, exactly up to its end once it parses."""
    stripped = text.lstrip()
    try:
        _, end = DECODER.raw_decode(stripped)
    except json.JSONDecodeError:
        return stripped, False
    return stripped[:end], True


def dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def object_text(pairs: Sequence[tuple[str, Any]], closed: bool) -> str:
    """`{"k": v, ...}` written pair by pair, so the text of fewer pairs (unclosed) is a prefix
    of the text of more: XML formats stream their arguments this way."""
    body = ", ".join(f"{dumps(k)}: {dumps(v)}" for k, v in pairs)
    return "{" + body + ("}" if closed else "")


def tool_name(tool: dict[str, Any]) -> str:
    return tool["function"]["name"]


def parameters(tool: dict[str, Any]) -> dict[str, Any]:
    return tool["function"].get("parameters") or {"type": "object", "properties": {}}


def listed_parameters(tool: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """The parameters an XML-style constrained call writes, in schema order: the required
    ones, or all of them when the schema names none as required."""
    schema = parameters(tool)
    props = schema.get("properties") or {}
    required = schema.get("required")
    names = [n for n in props if n in required] if required else list(props)
    return [(n, props[n] if isinstance(props[n], dict) else {}) for n in names]


def xml_value(schema: dict[str, Any]) -> Piece:
    """A parameter's value in an XML format: one of its values for a string enum, free text
    for another string, else its JSON."""
    if _schema_types(schema) != {"string"}:
        return ("json", schema)
    options = schema.get("enum")
    if isinstance(options, list) and options and all(isinstance(o, str) and "<" not in o for o in options):
        return ("ebnf", " | ".join(json.dumps(o, ensure_ascii=False) for o in options))
    if isinstance(schema.get("pattern"), str):
        return ("regex", schema["pattern"].removeprefix("^").removesuffix("$"))
    low, high = schema.get("minLength"), schema.get("maxLength")
    if isinstance(low, int) or isinstance(high, int):
        return ("regex", f"[^<]{{{low or 0},{high if isinstance(high, int) else ''}}}")
    return TEXT_VALUE


def typed_value(raw: str, schema: dict[str, Any] | None) -> Any:
    """An XML parameter's text as the JSON value its schema says: strings stay verbatim;
    numbers, booleans, null, objects and arrays are decoded; what fails to decode (or has no
    schema and is not JSON) stays the string it was written as."""
    kinds = _schema_types(schema)
    if kinds and kinds <= {"string"}:
        return raw
    try:
        value = json.loads(raw)
    except json.JSONDecodeError:
        return _python_literal(raw, kinds)
    if kinds and "string" in kinds and isinstance(value, str | int | float) and not (kinds & {"number", "integer"}):
        return raw
    return value


def _schema_types(schema: dict[str, Any] | None) -> set[str]:
    if not isinstance(schema, dict):
        return set()
    kind = schema.get("type")
    if isinstance(kind, str):
        return {kind}
    if isinstance(kind, list):
        return {k for k in kind if isinstance(k, str)}
    kinds: set[str] = set()
    for option in schema.get("anyOf") or schema.get("oneOf") or ():
        kinds |= _schema_types(option)
    return kinds


def _python_literal(raw: str, kinds: set[str]) -> Any:
    """Python-spelled literals some models write (`True`, `None`) for non-string types."""
    words = {"True": True, "False": False, "None": None}
    if kinds and raw.strip() in words:
        return words[raw.strip()]
    return raw

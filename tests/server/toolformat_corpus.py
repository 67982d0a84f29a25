"""The parser corpus, as data: for each family, text written the way that family's template
and documentation write calls (by the writers below, which share no code with the parsers),
with the content, reasoning and calls a reader must get out of it."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, NamedTuple


class Case(NamedTuple):
    id: str
    text: str
    content: str | None  # expected content (stripped when there are calls), None when empty
    calls: list[tuple[str, dict[str, Any]]]
    reasoning: str | None = None


def _tool(name: str, props: dict[str, Any]) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "parameters": {"type": "object", "properties": props}}}


TOOLS = [
    _tool("get_weather", {"city": {"type": "string"}, "days": {"type": "integer"}, "units": {"type": "string"}}),
    _tool(
        "search_docs",
        {
            "query": {"type": "string"},
            "limit": {"type": "integer"},
            "exact": {"type": "boolean"},
            "filters": {"type": "object"},
            "tags": {"type": "array", "items": {"type": "string"}},
        },
    ),
    _tool("add", {"a": {"type": "number"}, "b": {"type": "number"}}),
    _tool("note", {"text": {"type": "string"}, "when": {"type": ["string", "null"]}}),
    _tool("noop", {}),
]

# (label, tool, arguments): nested, unicode, escaped quotes, XML-special characters, ...
PAYLOADS: list[tuple[str, str, dict[str, Any]]] = [
    ("simple", "get_weather", {"city": "Paris"}),
    ("unicode", "get_weather", {"city": "São Paulo", "days": 3}),
    ("cjk", "get_weather", {"city": "東京", "units": "celsius"}),
    ("escaped_quotes", "search_docs", {"query": 'he said "hi"', "limit": 5}),
    ("xml_special", "search_docs", {"query": "a < b && c > d", "exact": True}),
    ("nested", "search_docs", {"query": "x", "filters": {"lang": "en", "year": {"gte": 2020}}, "tags": ["a", "b"]}),
    ("numbers", "add", {"a": 1.5, "b": -2}),
    ("newlines", "note", {"text": "line1\nline2\ttab"}),
    ("emoji_backslash", "note", {"text": "party 🎉 and C:\\dir\\file"}),
    ("no_arguments", "noop", {}),
    ("html", "note", {"text": "<b>bold</b> & 'single'"}),
    ("null_and_deep", "search_docs", {"query": "n", "filters": {"x": None, "list": [1, [2, 3], {"k": False}]}}),
    ("empty_string", "note", {"text": ""}),
    ("nullable", "note", {"text": "t", "when": None}),
    ("long_text", "note", {"text": "word " * 50}),
    ("digits_as_string", "get_weather", {"city": "123"}),
    ("false_and_empty_list", "search_docs", {"query": "q", "exact": False, "tags": []}),
    ("unicode_keys", "search_docs", {"query": "k", "filters": {"ключ": "значение", "emoji🎉": 1}}),
]

Writer = Callable[[list[tuple[str, dict[str, Any]]]], str]


def family_cases(
    write: Writer, *, before: bool = True, after: bool = True, think: tuple[str, str] | None = ("<think>", "</think>")
) -> list[Case]:
    """The cases every family shares, written by its `write` (a list of calls -> text)."""
    cases = [Case(label, write([(name, args)]), None, [(name, args)]) for label, name, args in PAYLOADS]
    two = [("get_weather", {"city": "Oslo"}), ("add", {"a": 1, "b": 2})]
    three = [*two, ("note", {"text": "third <one>"})]
    cases += [
        Case("parallel_two", write(two), None, two),
        Case("parallel_three", write(three), None, three),
        Case("plain_text", "Just an answer, no tools.", "Just an answer, no tools.", []),
        Case("unicode_text", "Ответ: 42 ✓", "Ответ: 42 ✓", []),
    ]
    if before:
        cases += [
            Case("text_before", "Let me check. " + write(two[:1]), "Let me check.", two[:1]),
            Case("text_before_parallel", "Checking both:\n" + write(two), "Checking both:", two),
        ]
    if after:
        cases.append(Case("text_after", write(two[:1]) + "\nDone.", "Done.", two[:1]))
    if think is not None:
        open_tag, close_tag = think
        call = write(two[:1])
        cases += [
            Case(
                "call_after_reasoning",
                f"{open_tag}I need the weather.{close_tag}{call}",
                None,
                two[:1],
                "I need the weather.",
            ),
            Case("call_inside_reasoning", f"{open_tag}Calling now {call}{close_tag}", None, two[:1], "Calling now "),
            Case("reasoning_then_text", f"{open_tag}hmm{close_tag}Hello", "Hello", [], "hmm"),
        ]
    return cases


def dumps(value: Any, ascii_: bool = False) -> str:
    return json.dumps(value, ensure_ascii=ascii_)

"""Tool-call parsing: whole completions and streamed deltas, split at every character."""
from __future__ import annotations

import json

import pytest

from agentkv.server.tools import ToolCallStreamParser, parse_tool_calls, render_tool_call

CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


def test_plain_text_has_no_calls():
    assert parse_tool_calls("Hello there") == ("Hello there", [])


def test_one_call_and_surrounding_text():
    content, calls = parse_tool_calls("Let me check.\n" + CALL)
    assert content == "Let me check."
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("get_weather", {"city": "Paris"})]
    assert calls[0].id.startswith("call_")


def test_two_calls_get_distinct_ids():
    _, calls = parse_tool_calls(CALL + "\n" + CALL.replace("Paris", "Rome"))
    assert [json.loads(c.arguments)["city"] for c in calls] == ["Paris", "Rome"]
    assert calls[0].id != calls[1].id


def test_unterminated_call_with_whole_json_counts():
    content, calls = parse_tool_calls(CALL.removesuffix("\n</tool_call>"))
    assert content is None and calls[0].name == "get_weather"


def test_malformed_json_stays_content():
    text = "<tool_call>{not json}</tool_call>"
    assert parse_tool_calls(text) == (text, [])


def test_parameters_alias_and_string_arguments():
    _, calls = parse_tool_calls('<tool_call>{"name": "f", "parameters": {"x": 1}}</tool_call>')
    assert json.loads(calls[0].arguments) == {"x": 1}
    _, calls = parse_tool_calls('<tool_call>{"name": "f", "arguments": "{\\"x\\": 2}"}</tool_call>')
    assert json.loads(calls[0].arguments) == {"x": 2}


@pytest.mark.parametrize("step", [1, 2, 3, 7])
def test_stream_deltas_match_whole_parse(step):
    text = "Sure <tool" + " thing. " + CALL + " done"
    parser = ToolCallStreamParser()
    events = []
    for i in range(0, len(text), step):
        events += parser.feed(text[i:i + step])
    events += parser.finish()
    content = "".join(e.content for e in events if e.content)
    calls = [e for e in events if e.call]
    assert content == "Sure <tool thing.  done"
    assert len(calls) == 1 and calls[0].index == 0 and calls[0].call.name == "get_weather"
    # No partial tag ever leaks as content.
    assert all("<tool_call" not in (e.content or "") for e in events)


def test_render_round_trips_through_parser():
    text = render_tool_call("f", '{"a": [1, 2]}')
    _, calls = parse_tool_calls(text)
    assert calls[0].name == "f" and json.loads(calls[0].arguments) == {"a": [1, 2]}

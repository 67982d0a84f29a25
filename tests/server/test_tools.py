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
        events += parser.feed(text[i : i + step])
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


def _streamed(text, step, **kw):
    parser = ToolCallStreamParser(**kw)
    events = []
    for i in range(0, len(text), step):
        events += parser.feed(text[i : i + step])
    return events + parser.finish(), parser


@pytest.mark.parametrize("step", [1, 2, 5])
def test_stream_sends_name_first_then_argument_fragments(step):
    text = CALL + "\n" + CALL.replace("Paris", "Rome")
    events, parser = _streamed(text, step)
    starts = [e for e in events if e.call is not None]
    assert [(e.index, e.call.name, e.call.arguments) for e in starts] == [
        (0, "get_weather", ""),
        (1, "get_weather", ""),
    ]
    for index, city in ((0, "Paris"), (1, "Rome")):
        fragments = [e.arguments for e in events if e.arguments is not None and e.index == index]
        assert "".join(fragments) == json.dumps({"city": city})
        assert len(fragments) > 1 or step > 1
        first = events.index(starts[index])
        assert all(events.index(e) > first for e in events if e.arguments and e.index == index)
    _, whole = parse_tool_calls(text)
    assert [c.arguments for c in parser.calls] == [c.arguments for c in whole]


def test_unknown_tool_names_stay_content():
    content, calls = parse_tool_calls(CALL, names=frozenset({"get_time"}))
    assert calls == [] and content == CALL
    events, parser = _streamed(CALL, 1, names=frozenset({"get_time"}))
    assert parser.calls == [] and "".join(e.content or "" for e in events) == CALL
    # control: the same text with the name known is a call
    assert parse_tool_calls(CALL, names=frozenset({"get_weather"}))[1][0].name == "get_weather"


def test_max_calls_drops_the_rest():
    text = CALL + "\n" + CALL.replace("Paris", "Rome")
    content, calls = parse_tool_calls(text, max_calls=1)
    assert [json.loads(c.arguments)["city"] for c in calls] == ["Paris"] and content is None
    events, parser = _streamed(text, 3, max_calls=1)
    assert len(parser.calls) == 1 and not any("Rome" in (e.arguments or e.content or "") for e in events)

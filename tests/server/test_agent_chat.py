"""The chat API as agent frameworks drive it, through the official openai client: unknown and
newer fields, tool_choice / parallel_tool_calls semantics, streamed tool calls (name first,
arguments in fragments), tools with a response_format, tool_choice "none"."""

from __future__ import annotations

import json

import httpx
import pytest

pytestmark = pytest.mark.slow

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "Current time in a timezone",
        "parameters": {"type": "object", "properties": {"tz": {"type": "string"}}, "required": ["tz"]},
    },
}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
ANSWER = {
    "type": "json_schema",
    "json_schema": {
        "name": "answer",
        "schema": {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
    },
}


def test_unknown_fields_are_logged_not_refused(http, caplog):
    body = {
        "model": "smollm2",
        "messages": ASK,
        "max_tokens": 2,
        "max_token": 5,
        "reasoning_effort": "low",
        "prompt_cache_key": "agent-1",
        "user": "u",
        "store": False,
        "metadata": {"a": "b"},
        "service_tier": "auto",
        "min_tokens": 0,
        "stop_token_ids": [],
        "n": None,
        "temperature": None,
        "stream": None,
        "tools": None,
        "tool_choice": None,
    }
    with caplog.at_level("WARNING", logger="agentkv.server"):
        r = http.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    assert any("max_token" in rec.getMessage() for rec in caplog.records)


def test_strict_request_fields_reject_unknown(strict_server):
    body = {"model": "smollm2", "messages": ASK, "max_tokens": 2}
    with httpx.Client(base_url=strict_server.base_url, timeout=300) as c:
        bad = c.post("/v1/chat/completions", json={**body, "max_token": 5})
        good = c.post("/v1/chat/completions", json={**body, "reasoning_effort": "low"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "max_token"
    assert "max_token" in bad.json()["error"]["message"]
    assert good.status_code == 200, good.text  # control: known fields pass


def _stream_calls(client, **kw):
    calls: dict[int, dict] = {}
    arg_deltas = 0
    with client.chat.completions.stream(model="smollm2", messages=ASK, temperature=0, **kw) as s:
        for event in s:
            if event.type != "chunk":
                continue
            for d in event.chunk.choices[0].delta.tool_calls or [] if event.chunk.choices else []:
                entry = calls.setdefault(d.index, {"name": None, "arguments": ""})
                if d.function and d.function.name:
                    assert entry["name"] is None and entry["arguments"] == ""  # name first
                    entry["name"] = d.function.name
                if d.function and d.function.arguments:
                    arg_deltas += 1
                    entry["arguments"] += d.function.arguments
        final = s.get_final_completion()
    return calls, arg_deltas, final


def test_streamed_tool_call_arguments_come_in_fragments(client):
    kw = dict(tools=[WEATHER, TIME], tool_choice="required", parallel_tool_calls=False, max_tokens=48)
    calls, arg_deltas, final = _stream_calls(client, **kw)
    whole = client.chat.completions.create(model="smollm2", messages=ASK, temperature=0, **kw)
    want = [(c.function.name, c.function.arguments) for c in whole.choices[0].message.tool_calls]
    assert [(c["name"], c["arguments"]) for c in calls.values()] == want
    assert [(c.function.name, c.function.arguments) for c in final.choices[0].message.tool_calls] == want
    assert arg_deltas > 1
    json.loads(want[0][1])


def test_parallel_tool_calls_false_gives_exactly_one(client):
    r = client.chat.completions.create(
        model="smollm2",
        temperature=0,
        max_tokens=96,
        tools=[WEATHER, TIME],
        tool_choice="required",
        parallel_tool_calls=False,
        messages=[{"role": "user", "content": "Weather in Paris, Rome and Oslo, and the time in UTC?"}],
    )
    assert r.choices[0].finish_reason == "tool_calls" and len(r.choices[0].message.tool_calls) == 1


def test_required_allows_several_calls(client):
    r = client.chat.completions.create(
        model="smollm2",
        temperature=0,
        max_tokens=160,
        tools=[WEATHER, TIME],
        tool_choice="required",
        messages=[{"role": "user", "content": "Weather in Paris, Rome and Oslo, and the time in UTC?"}],
    )
    calls = r.choices[0].message.tool_calls
    assert r.choices[0].finish_reason == "tool_calls" and len(calls) >= 1
    assert {c.function.name for c in calls} <= {"get_weather", "get_time"}


def test_response_format_with_tools_under_auto_can_call_a_tool(client):
    r = client.chat.completions.create(
        model="smollm2",
        messages=ASK,
        temperature=0,
        max_tokens=48,
        tools=[WEATHER],
        tool_choice="auto",
        response_format=ANSWER,
    )
    # Not held to the answer schema: the output is free to be a tool call.
    control = client.chat.completions.create(
        model="smollm2", messages=ASK, temperature=0, max_tokens=48, response_format=ANSWER
    )
    json.loads(control.choices[0].message.content)
    assert r.choices[0].message.tool_calls, r.choices[0].message
    assert r.choices[0].message.tool_calls[0].function.name == "get_weather"


def test_tool_choice_none_keeps_tools_in_the_prompt(client):
    kw = dict(model="smollm2", messages=ASK, temperature=0, max_tokens=8, tools=[WEATHER])
    none = client.chat.completions.create(tool_choice="none", **kw)
    auto = client.chat.completions.create(tool_choice="auto", **kw)
    bare = client.chat.completions.create(model="smollm2", messages=ASK, temperature=0, max_tokens=8)
    assert none.usage.prompt_tokens == auto.usage.prompt_tokens > bare.usage.prompt_tokens
    assert none.choices[0].message.tool_calls is None
    assert none.usage.prompt_tokens_details.cached_tokens > 0  # the same prefix, reused

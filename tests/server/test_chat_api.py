"""/v1/chat/completions over real HTTP with the official openai client (strict validation)."""

from __future__ import annotations

import json

import jsonschema
import pytest

pytestmark = pytest.mark.slow

HI = [{"role": "user", "content": "Say hi"}]
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 12}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "parameters": {
            "type": "object",
            "properties": {"zone": {"type": "string", "maxLength": 8}},
            "required": ["zone"],
            "additionalProperties": False,
        },
    },
}


def test_plain_chat(client):
    r = client.chat.completions.create(model="smollm2", messages=HI, max_tokens=6, temperature=0)
    assert r.object == "chat.completion" and r.model == "smollm2"
    choice = r.choices[0]
    assert choice.message.role == "assistant" and choice.message.content
    assert choice.finish_reason in ("stop", "length")
    assert r.usage.completion_tokens <= 6 and r.usage.prompt_tokens > 0
    assert r.usage.prompt_tokens_details.cached_tokens >= 0


def test_stream_matches_non_stream_at_temperature_0(client):
    whole = client.chat.completions.create(model="smollm2", messages=HI, max_tokens=8, temperature=0)
    chunks = list(
        client.chat.completions.create(
            model="smollm2",
            messages=HI,
            max_tokens=8,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == whole.choices[0].finish_reason
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


def test_n2_logprobs(client):
    r = client.chat.completions.create(
        model="smollm2", messages=HI, max_tokens=4, n=2, temperature=0, logprobs=True, top_logprobs=2
    )
    assert [c.index for c in r.choices] == [0, 1]
    assert r.choices[0].message.content == r.choices[1].message.content  # greedy
    entries = r.choices[0].logprobs.content
    assert len(entries) == 4 and all(len(e.top_logprobs) == 2 for e in entries)
    assert all(e.logprob <= 0 and e.top_logprobs[0].logprob >= e.top_logprobs[1].logprob for e in entries)
    assert r.usage.completion_tokens == 8


def test_stop_string(client):
    whole = client.chat.completions.create(model="smollm2", messages=HI, max_tokens=8, temperature=0)
    text = whole.choices[0].message.content
    cut = text.strip()[3:5]
    r = client.chat.completions.create(model="smollm2", messages=HI, max_tokens=8, temperature=0, stop=[cut])
    assert r.choices[0].finish_reason == "stop"
    assert r.choices[0].message.content == text[: text.index(cut)]


def test_seed_reproducible(client):
    kw = dict(
        model="smollm2",
        messages=[{"role": "user", "content": "Name a colour"}],
        max_tokens=6,
        temperature=1.0,
        seed=1234,
    )
    a, b = client.chat.completions.create(**kw), client.chat.completions.create(**kw)
    assert a.choices[0].message.content == b.choices[0].message.content


def test_extending_a_conversation_hits_the_cache(client, http):
    def hit_tokens() -> float:
        for line in http.get("/metrics").text.splitlines():
            if line.startswith("agentkv_prefix_cache_hit_tokens_total"):
                return float(line.split()[-1])
        raise AssertionError("no prefix-cache metric")

    msgs = [
        {"role": "system", "content": "You are a terse assistant for the cache test."},
        {"role": "user", "content": "Count to three."},
    ]
    first = client.chat.completions.create(model="smollm2", messages=msgs, max_tokens=4, temperature=0)
    before = hit_tokens()
    msgs += [{"role": "assistant", "content": first.choices[0].message.content}, {"role": "user", "content": "Again."}]
    second = client.chat.completions.create(model="smollm2", messages=msgs, max_tokens=4, temperature=0)
    assert second.usage.prompt_tokens_details.cached_tokens > 0
    assert hit_tokens() > before


def test_json_schema_output_validates(client):
    schema = {
        "type": "object",
        "properties": {"colour": {"type": "string", "maxLength": 10}, "count": {"type": "integer"}},
        "required": ["colour", "count"],
        "additionalProperties": False,
    }
    r = client.chat.completions.create(
        model="smollm2",
        messages=[{"role": "user", "content": "Give a colour and a count as JSON."}],
        max_tokens=40,
        temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "c", "schema": schema}},
    )
    assert r.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(r.choices[0].message.content), schema)


def test_json_object(client):
    r = client.chat.completions.create(
        model="smollm2",
        messages=[{"role": "user", "content": "Reply with a JSON object."}],
        max_tokens=30,
        temperature=0,
        response_format={"type": "json_object"},
    )
    if r.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(r.choices[0].message.content), dict)
    else:
        assert r.choices[0].message.content.startswith("{")


def _check_call(call, tool):
    assert call.type == "function" and call.id
    assert call.function.name == tool["function"]["name"]
    jsonschema.validate(json.loads(call.function.arguments), tool["function"]["parameters"])


def test_tool_choice_required(client):
    r = client.chat.completions.create(
        model="smollm2",
        messages=[{"role": "user", "content": "What is the weather in Paris?"}],
        tools=[WEATHER, TIME],
        tool_choice="required",
        max_tokens=48,
        temperature=0,
    )
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls" and len(choice.message.tool_calls) == 1
    call = choice.message.tool_calls[0]
    _check_call(call, WEATHER if call.function.name == "get_weather" else TIME)


def test_named_tool_choice_streamed(client):
    stream = client.chat.completions.create(
        model="smollm2",
        messages=[{"role": "user", "content": "What time is it in UTC?"}],
        tools=[WEATHER, TIME],
        tool_choice={"type": "function", "function": {"name": "get_time"}},
        max_tokens=48,
        temperature=0,
        stream=True,
    )
    calls, reasons = {}, []
    for chunk in stream:
        for delta in chunk.choices[0].delta.tool_calls or []:
            entry = calls.setdefault(delta.index, {"id": delta.id, "name": "", "arguments": ""})
            entry["name"] += delta.function.name or ""
            entry["arguments"] += delta.function.arguments or ""
        reasons.append(chunk.choices[0].finish_reason)
    assert reasons[-1] == "tool_calls" and list(calls) == [0]
    assert calls[0]["name"] == "get_time" and calls[0]["id"]
    jsonschema.validate(json.loads(calls[0]["arguments"]), TIME["function"]["parameters"])


def test_full_tool_loop(client):
    msgs = [{"role": "user", "content": "What is the weather in Paris?"}]
    first = client.chat.completions.create(
        model="smollm2", messages=msgs, tools=[WEATHER], tool_choice="required", max_tokens=48, temperature=0
    )
    call = first.choices[0].message.tool_calls[0]
    msgs.append(first.choices[0].message.model_dump(exclude_none=True))
    msgs.append({"role": "tool", "tool_call_id": call.id, "content": json.dumps({"sky": "sunny", "c": 21})})
    answer = client.chat.completions.create(
        model="smollm2", messages=msgs, tools=[WEATHER], tool_choice="none", max_tokens=12, temperature=0
    )
    assert answer.choices[0].message.content and answer.choices[0].message.tool_calls is None
    assert answer.usage.prompt_tokens_details.cached_tokens > 0

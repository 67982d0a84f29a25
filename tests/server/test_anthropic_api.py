"""POST /v1/messages and /v1/messages/count_tokens through the official anthropic client:
a full tool loop (tool_use -> tool_result -> text) whole and streamed, streamed tool input
equal to the whole one, cache reads on the second turn, count_tokens, cache_control pins,
Anthropic's error shapes, x-api-key."""

from __future__ import annotations

import anthropic
import httpx
import pytest

from tests.server.conftest import API_KEY

pytestmark = pytest.mark.slow

WEATHER = {
    "name": "get_weather",
    "description": "Current weather for a city",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 12}},
        "required": ["city"],
        "additionalProperties": False,
    },
}
SYSTEM = "You are a weather assistant. Use the tools to answer."
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
# This anthropic client has no sampling arguments; the API still takes them in the body.
GREEDY = {"temperature": 0}


def make(server, key: str = "unused") -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.base_url, api_key=key, max_retries=0, timeout=300)


@pytest.fixture(scope="module")
def claude(smollm2_server) -> anthropic.Anthropic:
    return make(smollm2_server)


def _call(claude, stream: bool):
    kw = dict(
        model="smollm2",
        max_tokens=48,
        system=SYSTEM,
        messages=ASK,
        tools=[WEATHER],
        tool_choice={"type": "any"},
        extra_body=GREEDY,
    )
    if not stream:
        return claude.messages.create(**kw), 0
    num_json = 0
    with claude.messages.stream(**kw) as s:
        for ev in s:
            if ev.type == "content_block_delta" and ev.delta.type == "input_json_delta":
                num_json += 1
        return s.get_final_message(), num_json


def test_tool_loop_whole_and_streamed(claude):
    whole, _ = _call(claude, stream=False)
    streamed, num_json = _call(claude, stream=True)
    use = [b for b in whole.content if b.type == "tool_use"]
    assert whole.stop_reason == "tool_use" and use and use[0].name == "get_weather"
    assert [(b.name, b.input) for b in streamed.content if b.type == "tool_use"] == [(b.name, b.input) for b in use]
    assert streamed.stop_reason == "tool_use" and num_json > 1
    second = ASK + [
        {"role": "assistant", "content": [b.model_dump() for b in whole.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use[0].id, "content": "18 C and sunny"}]},
    ]
    kw = dict(model="smollm2", max_tokens=24, system=SYSTEM, messages=second, tools=[WEATHER], extra_body=GREEDY)
    final = claude.messages.create(**kw)
    assert final.stop_reason in ("end_turn", "max_tokens")
    assert [b.type for b in final.content] == ["text"] and final.content[0].text
    assert final.usage.cache_read_input_tokens > 0  # the first turn's prefix, reused
    with claude.messages.stream(**kw) as s:
        text = "".join(s.text_stream)
        again = s.get_final_message()
    assert text == final.content[0].text and again.usage.output_tokens == final.usage.output_tokens


def test_count_tokens_equals_the_request_usage(claude):
    kw = dict(model="smollm2", system=SYSTEM, messages=ASK, tools=[WEATHER])
    counted = claude.messages.count_tokens(**kw)
    r = claude.messages.create(max_tokens=2, extra_body=GREEDY, **kw)
    u = r.usage
    assert counted.input_tokens == u.input_tokens + u.cache_read_input_tokens + u.cache_creation_input_tokens
    bare = claude.messages.count_tokens(model="smollm2", messages=ASK)
    assert bare.input_tokens < counted.input_tokens  # control: the tools are counted


def test_stop_sequences_and_plain_text(claude):
    r = claude.messages.create(
        model="smollm2",
        max_tokens=32,
        messages=[{"role": "user", "content": "Count: one, two, three, four, five"}],
        extra_body=GREEDY,
    )
    words = r.content[0].text.split()
    assert r.content[0].type == "text" and len(words) > 1
    cut = claude.messages.create(
        model="smollm2",
        max_tokens=32,
        extra_body=GREEDY,
        stop_sequences=[words[1]],
        messages=[{"role": "user", "content": "Count: one, two, three, four, five"}],
    )
    assert cut.stop_reason == "stop_sequence" and cut.stop_sequence == words[1]
    assert cut.content[0].text == r.content[0].text[: r.content[0].text.index(words[1])]


def test_cache_control_pins_the_prefix(claude, smollm2_engine):
    system = [
        {
            "type": "text",
            "text": "You are a careful pinning test assistant. " * 8,
            "cache_control": {"type": "ephemeral", "ttl": "1h"},
        }
    ]
    cache = smollm2_engine.engine.cache
    before = cache.num_pins
    r = claude.messages.create(model="smollm2", max_tokens=2, system=system, messages=ASK, extra_body=GREEDY)
    assert cache.num_pins == before + 1
    assert r.usage.cache_creation_input_tokens + r.usage.cache_read_input_tokens > 0
    control = claude.messages.create(model="smollm2", max_tokens=2, messages=ASK, extra_body=GREEDY)
    assert cache.num_pins == before + 1 and control.usage.cache_creation_input_tokens == 0


def test_errors_in_anthropic_shape(claude, http):
    with pytest.raises(anthropic.NotFoundError) as nf:
        claude.messages.create(model="nope", max_tokens=4, messages=ASK)
    assert nf.value.status_code == 404 and nf.value.body["error"]["type"] == "not_found_error"
    r = http.post("/v1/messages", json={"model": "smollm2", "messages": ASK})  # no max_tokens
    body = r.json()
    assert r.status_code == 400 and body["type"] == "error"
    assert body["error"]["type"] == "invalid_request_error" and "max_tokens" in body["error"]["message"]
    with pytest.raises(anthropic.BadRequestError) as bad:
        claude.messages.create(
            model="smollm2",
            max_tokens=4,
            messages=[{"role": "user", "content": [{"type": "image", "source": {"type": "url", "url": "x"}}]}],
        )
    assert "'image'" in bad.value.body["error"]["message"]
    ttl = http.post(
        "/v1/messages",
        json={
            "model": "smollm2",
            "max_tokens": 2,
            "messages": [
                {
                    "role": "user",
                    "content": [{"type": "text", "text": "hi", "cache_control": {"type": "ephemeral", "ttl": "2d"}}],
                }
            ],
        },
    )
    assert ttl.status_code == 400 and "ttl='2d'" in ttl.json()["error"]["message"]
    # Control: the OpenAI routes keep OpenAI's shape.
    openai_shape = http.post("/v1/chat/completions", json={"model": "smollm2"}).json()
    assert "type" not in openai_shape and "param" in openai_shape["error"]


def test_x_api_key(keyed_server):
    good = make(keyed_server, API_KEY).messages.create(model="smollm2", max_tokens=2, messages=ASK)
    assert good.type == "message"
    with pytest.raises(anthropic.AuthenticationError) as err:
        make(keyed_server, "wrong").messages.create(model="smollm2", max_tokens=2, messages=ASK)
    assert err.value.body["error"]["type"] == "authentication_error"
    r = httpx.post(
        f"{keyed_server.base_url}/v1/messages",
        timeout=300,
        headers={"x-api-key": API_KEY, "anthropic-version": "2023-06-01"},
        json={"model": "smollm2", "max_tokens": 2, "messages": ASK},
    )
    assert r.status_code == 200 and r.json()["usage"]["input_tokens"] >= 0

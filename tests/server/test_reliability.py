"""Nothing a client sends takes the server down: a request that fails inside the engine gets
the API's own error (a 4xx when the request caused it, never finish_reason "error"), text
that is no Unicode is a 400, and fan-out and body size have caps with their own errors."""

from __future__ import annotations

import json
from collections.abc import Iterator

import anthropic
import httpx
import openai
import pytest

from agentkv.server.app import create_app
from agentkv.server.lifecycle import ServerLimits
from tests.server.conftest import LiveServer, serve

pytestmark = pytest.mark.slow

MSG = [{"role": "user", "content": "Say something."}]
# Admitted by the schema checks (the pattern can start: '"' then 'a'), but no character
# matches [^\s\S], so after two tokens the grammar allows none: a dead end mid-output.
DEAD_END = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "string", "pattern": "a[^\\s\\S]"}}}
# The control: the same shape of schema with a pattern that can be completed.
LIVE = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "string", "pattern": "a[bc]"}}}


def chat_body(**kw) -> dict:
    return {"model": "smollm2", "messages": MSG, "max_tokens": 10, "temperature": 0, **kw}


def error_of(r: httpx.Response, status: int) -> dict:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    return err


def sse_payloads(r: httpx.Response) -> list:
    return [line[len("data: ") :] for line in r.iter_lines() if line.startswith("data: ")]


def test_a_grammar_dead_end_is_a_400_and_the_server_goes_on(http, client):
    live = http.post("/v1/chat/completions", json=chat_body(response_format=LIVE))
    assert live.status_code == 200 and live.json()["choices"][0]["message"]["content"] in ('"ab"', '"ac"')
    err = error_of(http.post("/v1/chat/completions", json=chat_body(response_format=DEAD_END)), 400)
    assert err["code"] == "generation_dead_end" and "nothing can be sampled" in err["message"]
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(**chat_body(response_format=DEAD_END))
    after = client.chat.completions.create(**chat_body())
    assert after.choices[0].finish_reason in ("stop", "length")


def test_a_dead_end_mid_stream_is_an_error_event_then_the_end(http):
    with http.stream("POST", "/v1/chat/completions", json=chat_body(response_format=DEAD_END, stream=True)) as r:
        assert r.status_code == 200
        payloads = sse_payloads(r)
    assert payloads[-1] == "[DONE]"
    events = [json.loads(p) for p in payloads[:-1]]
    assert events[0]["choices"][0]["delta"]["role"] == "assistant"
    assert events[-1]["error"]["code"] == "generation_dead_end"
    reasons = [c.get("finish_reason") for e in events for c in e.get("choices", ())]
    assert "error" not in reasons


def test_a_dead_end_in_the_anthropic_stream_is_its_error_event(smollm2_server):
    """The same refusal in Anthropic's shape: the official client raises on the error event."""
    client = anthropic.Anthropic(base_url=smollm2_server.base_url, api_key="unused", max_retries=0)
    body = {"model": "smollm2", "max_tokens": 10, "messages": MSG}
    with client.messages.stream(**body) as stream:  # the control: a stream that ends well
        assert stream.get_final_message().stop_reason in ("end_turn", "max_tokens")
    r = httpx.post(
        f"{smollm2_server.base_url}/v1/messages",
        timeout=300,
        json={
            **body,
            "max_tokens": 60,
            "stream": True,
            "tool_choice": {"type": "any"},
            "tools": [
                {
                    "name": "f",
                    "input_schema": {
                        "type": "object",
                        "properties": {"a": {"type": "string", "pattern": "a[^\\s\\S]"}},
                        "required": ["a"],
                    },
                }
            ],
        },
    )
    frames = r.text.split("\n\n")
    assert r.status_code == 200 and frames[0].startswith("event: message_start")
    last = [f for f in frames if f.strip()][-1]
    assert last.startswith("event: error") and '"invalid_request_error"' in last


@pytest.mark.parametrize(
    "path, body",
    [
        ("/v1/chat/completions", {"model": "smollm2", "messages": [{"role": "user", "content": "a\ud800b"}]}),
        ("/v1/completions", {"model": "smollm2", "prompt": "x\udfff", "max_tokens": 1}),
        ("/v1/completions", {"model": "smollm2", "prompt": ["ok", "\ud800"], "max_tokens": 1}),
        ("/tokenize", {"prompt": "\ud800"}),
    ],
)
def test_a_lone_surrogate_is_a_400(http, path, body):
    err = error_of(post_escaped(http, path, body), 400)
    assert "lone surrogate" in err["message"]


def post_escaped(http, path: str, body: dict) -> httpx.Response:
    """The body as JSON with every non-ASCII character escaped: `\\ud800` on the wire."""
    return http.post(path, content=json.dumps(body).encode(), headers={"content-type": "application/json"})


def test_a_surrogate_pair_is_text_and_a_lone_one_is_a_400_on_messages(http):
    pair = post_escaped(http, "/v1/completions", {"model": "smollm2", "prompt": "\ud83d\ude00", "max_tokens": 1})
    assert pair.status_code == 200, pair.text  # the control: a pair is one character
    r = post_escaped(
        http, "/v1/messages", {"model": "smollm2", "max_tokens": 1, "messages": [{"role": "user", "content": "\ud800"}]}
    )
    assert r.status_code == 400 and r.json()["type"] == "error"
    assert "lone surrogate" in r.json()["error"]["message"]


def test_fan_out_over_the_cap_is_a_400_naming_both_numbers(http):
    ok = http.post("/v1/completions", json={"model": "smollm2", "prompt": ["a"] * 4, "n": 16, "max_tokens": 1})
    assert ok.status_code == 200 and len(ok.json()["choices"]) == 64  # the cap itself is allowed
    err = error_of(
        http.post("/v1/completions", json={"model": "smollm2", "prompt": ["a"] * 5, "n": 13, "max_tokens": 1}), 400
    )
    assert err["code"] == "fanout_exceeded" and err["param"] == "n"
    assert all(num in err["message"] for num in ("5 prompts", "n=13", "65", "64"))


@pytest.fixture(scope="module")
def small_body_server(smollm2_engine) -> Iterator[LiveServer]:
    app = create_app(smollm2_engine, served_model_name="smollm2", limits=ServerLimits(max_body_bytes=4096))
    yield from serve(app, smollm2_engine)


def test_a_body_over_the_limit_is_a_413_in_each_api_shape(small_body_server):
    base = small_body_server.base_url
    small = {"model": "smollm2", "prompt": "hi", "max_tokens": 1}
    assert httpx.post(f"{base}/v1/completions", json=small, timeout=300).status_code == 200
    big = {"model": "smollm2", "prompt": "word " * 2000, "max_tokens": 1}
    err = error_of(httpx.post(f"{base}/v1/completions", json=big, timeout=300), 413)
    assert err["code"] == "request_too_large" and "4096" in err["message"]

    def chunked():  # no Content-Length: counted as it arrives
        for _ in range(10):
            yield b" " * 1000
        yield json.dumps(small).encode()

    r = httpx.post(
        f"{base}/v1/completions", content=chunked(), timeout=300, headers={"content-type": "application/json"}
    )
    assert error_of(r, 413)["code"] == "request_too_large"
    r = httpx.post(
        f"{base}/v1/messages",
        timeout=300,
        json={"model": "smollm2", "max_tokens": 1, "messages": [{"role": "user", "content": "w " * 4000}]},
    )
    assert r.status_code == 413 and r.json()["error"]["type"] == "request_too_large"
    with pytest.raises(openai.APIStatusError) as info:
        openai.OpenAI(base_url=f"{base}/v1", api_key="x", max_retries=0).completions.create(**big)
    assert info.value.status_code == 413

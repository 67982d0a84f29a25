"""Every client mistake is an OpenAI-shaped 4xx (never a 500), and the server keeps serving."""

from __future__ import annotations

import time

import httpx
import openai
import pytest

from agentkv.runtime.async_engine import AsyncEngine
from agentkv.server.app import create_app

pytestmark = pytest.mark.slow

MSG = [{"role": "user", "content": "hi"}]


def check(r: httpx.Response, status: int, param: str | None = "any") -> dict:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    if param != "any":
        assert err["param"] == param, err
    return err


def chat(http, **body) -> httpx.Response:
    return http.post("/v1/chat/completions", json={"model": "smollm2", "messages": MSG, "max_tokens": 2, **body})


def test_malformed_json(http):
    r = http.post(
        "/v1/chat/completions",
        content=b'{"model": "smollm2", "messages": [',
        headers={"content-type": "application/json"},
    )
    assert "JSON" in check(r, 400)["message"]


@pytest.mark.parametrize(
    "body, param",
    [
        ({"temperature": "hot"}, "temperature"),
        ({"max_tokens": "5"}, "max_tokens"),
        ({"messages": "hi"}, "messages"),
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "wizard", "content": "x"}]}, "messages.0.role"),
        ({"response_format": {"type": "xml"}}, "response_format.type"),
    ],
)
def test_wrong_types_and_unknown_fields(http, body, param):
    check(chat(http, **body), 400, param)


@pytest.mark.parametrize(
    "body, param",
    [
        ({"top_p": 2.0}, "top_p"),
        ({"temperature": -1}, "temperature"),
        ({"presence_penalty": 5}, "presence_penalty"),
        ({"top_logprobs": 50, "logprobs": True}, "top_logprobs"),
        ({"top_logprobs": 2}, "top_logprobs"),
        ({"n": 0}, "n"),
        ({"max_tokens": -1}, "max_tokens"),
        ({"logit_bias": {"99999999": 1}}, None),
        (
            {
                "tool_choice": {"type": "function", "function": {"name": "nope"}},
                "tools": [{"type": "function", "function": {"name": "f"}}],
            },
            "tool_choice",
        ),
        ({"tool_choice": "required"}, "tool_choice"),
        (
            {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
            "messages.0.content.0",
        ),
        ({"response_format": {"type": "json_schema"}}, "response_format.json_schema"),
    ],
)
def test_out_of_range(http, body, param):
    err = check(chat(http, **body), 400)
    if param is not None:
        assert err["param"] == param, err


def test_prompt_too_long_names_both_lengths(http):
    long = "word " * 1500
    err = check(chat(http, messages=[{"role": "user", "content": long}]), 400)
    assert "1024" in err["message"] and err["code"] == "context_length_exceeded"
    r = http.post("/v1/completions", json={"model": "smollm2", "prompt": "hi " * 600, "max_tokens": 600})
    err = check(r, 400)
    assert "1024" in err["message"] and "600" in err["message"]


def test_completion_errors(http):
    check(http.post("/v1/completions", json={"model": "smollm2", "prompt": [10**9]}), 400, "prompt")
    check(http.post("/v1/completions", json={"model": "smollm2", "prompt": []}), 400, "prompt")
    check(http.post("/v1/completions", json={"model": "smollm2", "prompt": "x", "max_tokens": 0}), 400, "max_tokens")
    check(http.post("/v1/embeddings", json={"model": "smollm2", "input": "x"}), 400, "model")
    check(http.post("/detokenize", json={"tokens": [-1]}), 400, "tokens")


def test_unknown_model_is_404(client, http):
    err = check(chat(http, model="gpt-5"), 404, "model")
    assert err["code"] == "model_not_found"
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="gpt-5", messages=MSG, max_tokens=2)


def test_api_key(keyed_server, server_tools):
    url = f"{keyed_server.base_url}/v1/chat/completions"
    body = {"model": "smollm2", "messages": MSG, "max_tokens": 1}
    assert check(httpx.post(url, json=body), 401)["type"] == "authentication_error"
    check(httpx.post(url, json=body, headers={"Authorization": "Bearer wrong"}), 401)
    with pytest.raises(openai.AuthenticationError):
        server_tools.client(keyed_server, "wrong").models.list()
    assert server_tools.client(keyed_server, "test-key").models.list().data[0].id == "smollm2"
    assert httpx.get(f"{keyed_server.base_url}/health").status_code == 200


def test_errors_are_counted_and_the_server_still_serves(client, http):
    chat(http, top_p=9)
    assert 'endpoint="/v1/chat/completions",status="400"' in http.get("/metrics").text
    r = client.chat.completions.create(model="smollm2", messages=MSG, max_tokens=2)
    assert r.choices[0].message.content is not None


@pytest.fixture(scope="module")
def uncached_server(server_tools):
    """Prefix cache off: every block a request held must be free once it ends, so 'returned to
    the pool' is an exact count (with the cache on, finished blocks stay cached, counted used)."""
    engine = AsyncEngine.from_model("smollm2", max_model_len=1024, kv_cache_blocks=128, enable_prefix_cache=False)
    server, base = server_tools.start(create_app(engine, served_model_name="smollm2"))
    yield base, engine
    server.should_exit = True


def test_disconnect_mid_stream_frees_kv(uncached_server):
    base, engine = uncached_server

    def settled():
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            s = engine.stats()
            if s.num_running == 0 and s.num_waiting == 0:
                return s
            time.sleep(0.05)
        raise AssertionError("requests still running")

    before = settled()
    assert before.kv_blocks_used == 0
    body = {
        "model": "smollm2",
        "messages": [{"role": "user", "content": "Write a long story about a dragon."}],
        "max_tokens": 400,
        "temperature": 0,
        "stream": True,
    }
    with httpx.Client(base_url=base, timeout=60) as c:
        with c.stream("POST", "/v1/chat/completions", json=body) as r:
            lines = r.iter_lines()
            for _ in range(2 * 10):
                next(lines)
            during = engine.stats()
            assert during.num_running == 1 and during.kv_blocks_used > 0
    after = settled()
    assert after.kv_blocks_used == 0 and after.kv_blocks_free == 128
    assert after.generation_tokens < 400  # aborted, not run to the end


def test_disconnect_during_non_streaming_request_frees_kv(uncached_server):
    """A client that gives up on a non-streaming request (timeout) aborts it too."""
    base, engine = uncached_server
    deadline = time.monotonic() + 30
    while engine.stats().num_running and time.monotonic() < deadline:
        time.sleep(0.05)
    generated_before = engine.stats().generation_tokens
    # EOS (ids 0 and 2) banned, so the answer runs to 400 tokens unless the disconnect stops it
    body = {
        "model": "smollm2",
        "messages": [{"role": "user", "content": "Tell me a long story."}],
        "max_tokens": 400,
        "temperature": 0,
        "logit_bias": {"0": -100, "2": -100},
    }
    with httpx.Client(base_url=base, timeout=1.0) as c:
        with pytest.raises(httpx.ReadTimeout):
            c.post("/v1/chat/completions", json=body)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        s = engine.stats()
        if s.num_running == 0 and s.num_waiting == 0:
            break
        time.sleep(0.05)
    s = engine.stats()
    assert s.num_running == 0 and s.kv_blocks_used == 0
    assert s.generation_tokens - generated_before < 400

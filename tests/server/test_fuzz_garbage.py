"""Hypothesis-generated garbage posted as raw bytes to every POST endpoint: random JSON, a
valid body with one field swapped for a wrong type, a huge number, NaN/inf, a lone surrogate
or deep nesting, and bodies that are not UTF-8 at all. Zero responses >= 500, and the server
still answers a normal request afterwards."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentkv.runtime.async_engine import AsyncEngine
from agentkv.server.app import create_app
from agentkv.server.errors import utf8_safe
from agentkv.server.schemas import lone_surrogate_at
from tests.server.conftest import LiveServer, serve

pytestmark = pytest.mark.slow

MSG = [{"role": "user", "content": "hi"}]
# One valid body per endpoint; the strategies break it.
VALID: dict[str, dict[str, Any]] = {
    "/v1/chat/completions": {"model": "smollm2", "messages": MSG, "max_tokens": 2},
    "/v1/completions": {"model": "smollm2", "prompt": "hi", "max_tokens": 2},
    "/v1/messages": {"model": "smollm2", "messages": MSG, "max_tokens": 2},
    "/v1/messages/count_tokens": {"model": "smollm2", "messages": MSG},
    "/v1/embeddings": {"model": "smollm2", "input": "hi"},
    "/tokenize": {"model": "smollm2", "prompt": "hi"},
    "/detokenize": {"model": "smollm2", "tokens": [1, 2]},
}
ENDPOINTS = sorted(VALID)
# JSON text no json.dumps writes: non-finite literals, huge and lone-surrogate escapes.
WEIRD_LITERALS = [
    "NaN",
    "Infinity",
    "-Infinity",
    "1e999",
    "-1e999",
    "1" + "0" * 400,
    "18446744073709551616",
    "-9223372036854775809",
    "1e-400",
    "0.0",
    "-0",
    '"\\ud800"',
    '"\\udfff"',
    '"a\\ud83dz"',
    '"\\u0000"',
    '""',
    "[]",
    "{}",
    "null",
    "true",
    '"' + "x" * 5000 + '"',
    '{"type": "text", "text": "\\ud800"}',
    '[{"role": "user", "content": "\\udc00"}]',
    "[" * 2000 + "]" * 2000,
    '{"a":' * 2000 + "1" + "}" * 2000,
    "[" * 60000 + "]" * 60000,
]
CONTEXT = 48

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12,
)


def _with_field(endpoint: str, key: str, literal: str) -> bytes:
    """VALID[endpoint] with `key` set to raw JSON text `literal` (which json.dumps can't write)."""
    body = dict(VALID[endpoint])
    body[key] = "__SLOT__"
    return json.dumps(body).replace('"__SLOT__"', literal).encode()


@st.composite
def garbage(draw: Any, endpoint: str) -> bytes:
    kind = draw(st.sampled_from(["random", "field", "literal", "bytes", "nested-field"]))
    if kind == "random":
        return json.dumps(draw(json_values), allow_nan=True).encode()
    keys = sorted(
        {
            *VALID[endpoint],
            "n",
            "temperature",
            "top_p",
            "seed",
            "stop",
            "logit_bias",
            "repetition_penalty",
            "max_tokens",
            "response_format",
            "tools",
            "prompt",
            "messages",
            "system",
            "input",
            "tokens",
            "stream",
        }
    )
    key = draw(st.sampled_from(keys))
    if kind == "field":
        return _with_field(endpoint, key, json.dumps(draw(json_values), allow_nan=True))
    if kind == "literal":
        return _with_field(endpoint, key, draw(st.sampled_from(WEIRD_LITERALS)))
    if kind == "nested-field":
        return _with_field(
            endpoint, "messages", json.dumps([{"role": "user", "content": draw(json_values)}], allow_nan=True)
        )
    raw = draw(st.binary(max_size=64))
    return b'{"model": "smollm2", "prompt": "' + raw + b'\xff\xfe", "messages": [' + raw


@pytest.fixture(scope="module")
def garbage_server() -> Iterator[LiveServer]:
    engine = AsyncEngine.from_model("smollm2", max_model_len=CONTEXT, kv_cache_blocks=64)
    yield from serve(create_app(engine, served_model_name="smollm2"), engine)


@pytest.fixture(scope="module")
def http(garbage_server) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=garbage_server.base_url, timeout=120) as c:
        yield c


@pytest.mark.parametrize("endpoint", ENDPOINTS)
def test_garbage_is_never_a_server_error(http, endpoint):
    @settings(max_examples=25, derandomize=True, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(body=garbage(endpoint))
    def post(body: bytes) -> None:
        r = http.post(endpoint, content=body, headers={"content-type": "application/json"})
        assert r.status_code < 500, f"{endpoint} {body[:300]!r} -> {r.status_code}: {r.text[:300]}"

    post()


@pytest.mark.parametrize("endpoint", ENDPOINTS)
def test_every_weird_literal_in_every_field(http, endpoint):
    """The literal list exhaustively (hypothesis samples it), in each field of the valid body."""
    for key in VALID[endpoint]:
        for literal in WEIRD_LITERALS:
            r = http.post(
                endpoint, content=_with_field(endpoint, key, literal), headers={"content-type": "application/json"}
            )
            assert r.status_code < 500, f"{endpoint} {key}={literal[:60]} -> {r.status_code}: {r.text[:300]}"


def test_valid_bodies_succeed_after_the_garbage(http):
    """The control: each valid body is accepted (so the garbage was refused for its garbage),
    and the engine still generates."""
    for endpoint in ENDPOINTS:
        r = http.post(endpoint, json=VALID[endpoint])
        expected = 400 if endpoint == "/v1/embeddings" else 200  # smollm2 does not embed
        assert r.status_code == expected, f"{endpoint}: {r.text[:300]}"
    r = http.post("/v1/chat/completions", json=VALID["/v1/chat/completions"])
    assert r.json()["usage"]["completion_tokens"] >= 1


# --- regressions the fuzzing found ----------------------------------------------------------


@pytest.mark.parametrize(
    "endpoint, body, where",
    [
        ("/tokenize", '{"prompt": "a\\ud800b"}', "prompt"),
        ("/v1/completions", '{"model": "smollm2", "prompt": "\\udfff", "max_tokens": 2}', "prompt"),
        (
            "/v1/chat/completions",
            (
                '{"model": "smollm2", "max_tokens": 2, "messages": '
                '[{"role": "user", "content": [{"type": "text", "text": "\\ud800"}]}]}'
            ),
            "messages.0.content.0.text",
        ),
        (
            "/v1/messages",
            (
                '{"model": "smollm2", "max_tokens": 2, "messages": '
                '[{"role": "user", "content": "hi"}], "system": "\\udc00"}'
            ),
            "system",
        ),
        (
            "/v1/chat/completions",
            ('{"model": "smollm2", "messages": [{"role": "user", "content": "hi"}], "logit_bias": {"\\ud800": 1}}'),
            "logit_bias.\\ud800",
        ),
    ],
)
def test_lone_surrogate_is_a_400_naming_where(http, endpoint, body, where):
    """Was a 500 (the tokenizer's TypeError); now the body's validation refuses it, in the
    endpoint's own error shape, quoting the path with the surrogate escaped."""
    r = http.post(endpoint, content=body.encode(), headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert f"{where} holds a lone surrogate" in error["message"]
    assert error["type"] == "invalid_request_error"


def test_a_surrogate_pair_is_text(http):
    """The control: an escaped pair (an emoji) is valid Unicode and is served."""
    r = http.post("/tokenize", content=b'{"prompt": "\\ud83d\\ude00"}', headers={"content-type": "application/json"})
    assert r.status_code == 200, r.text
    assert r.json()["count"] >= 1


def test_lone_surrogate_search_is_iterative():
    """A deeply nested body is walked without recursion (no RecursionError, so no 500)."""
    deep: object = "\ud800"
    for _ in range(50_000):
        deep = [deep]
    assert lone_surrogate_at(deep) == ".".join(["0"] * 50_000)
    assert lone_surrogate_at({"a": ["ok", {"b": "\U0001f600"}]}) is None
    assert utf8_safe("x\ud800y") == "x\\ud800y"


@pytest.mark.parametrize(
    "extra",
    [
        {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"anyOf": []}}}},
        {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"not": {}}}}},
        {"repetition_penalty": 1e-40},
        {
            "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "nope"}}}],
            "tool_choice": "required",
        },
        {"max_tokens": 10**30},
        {"seed": 2**70},
        {"logit_bias": {"99999999999999999999": 1}},
        {"stop": ["x" * 10000]},
        {"n": 16, "max_tokens": 8},
    ],
    ids=[
        "empty-anyOf",
        "not-anything",
        "tiny-repetition-penalty",
        "bad-tool-schema",
        "huge-max-tokens",
        "huge-seed",
        "huge-logit-bias-key",
        "long-stop",
        "max-fan-out",
    ],
)
def test_one_bad_request_does_not_take_the_server_down(http, extra):
    """Bodies that once killed the engine for every client: each is refused or served, and
    the next normal request still generates."""
    r = http.post("/v1/chat/completions", json={**VALID["/v1/chat/completions"], **extra})
    assert r.status_code < 500, r.text[:300]
    after = http.post("/v1/chat/completions", json=VALID["/v1/chat/completions"])
    assert after.status_code == 200, after.text[:300]
    assert after.json()["usage"]["completion_tokens"] >= 1

"""Schemathesis against the live server's own /openapi.json: every operation, positive and
negative cases, a bounded and derandomized number of examples. Zero responses >= 500, and a
normal request still succeeds afterwards.

The server runs smollm2 with a 64-token context, so whatever max_tokens or n a case asks for,
generation stays a few dozen tokens at most (a longer ask is a 400, which is fine)."""

from __future__ import annotations

import re
from collections.abc import Iterator

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode

from agentkv.runtime.async_engine import AsyncEngine
from agentkv.server.app import create_app
from tests.server.conftest import LiveServer, serve

pytestmark = pytest.mark.slow

# Per operation and mode; 14 operations on two shared cores keep the whole test well under 2 minutes.
MAX_EXAMPLES = 10
FUZZ_CONTEXT = 64


@pytest.fixture(scope="module")
def fuzz_server() -> Iterator[LiveServer]:
    engine = AsyncEngine.from_model("smollm2", max_model_len=FUZZ_CONTEXT, kv_cache_blocks=64)
    yield from serve(create_app(engine, served_model_name="smollm2"), engine)


@pytest.fixture(scope="module")
def fuzz_schema(fuzz_server):
    return schemathesis.openapi.from_url(f"{fuzz_server.base_url}/openapi.json")


def _operations(schema) -> list:
    return [result.ok() for result in schema.get_all_operations()]


def test_schema_covers_every_endpoint(fuzz_schema):
    """The control for the fuzz test below: it would reach every route the app serves."""
    labels = {op.label for op in _operations(fuzz_schema)}
    assert {
        "POST /v1/chat/completions",
        "POST /v1/completions",
        "POST /v1/messages",
        "POST /v1/messages/count_tokens",
        "POST /v1/embeddings",
        "POST /v1/rerank",
        "POST /score",
        "POST /classify",
        "POST /tokenize",
        "POST /detokenize",
        "GET /v1/models",
        "GET /v1/models/{model_id}",
        "GET /health",
        "GET /metrics",
    } <= labels


# How a generated body is used: as is, with the served model's name (past the model check),
# or as one generated field dropped into a body that is otherwise valid (into generation).
HOW = ("as-is", "served-model", "one-field")
BASES = {
    "/v1/chat/completions": {"model": "smollm2", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3},
    "/v1/completions": {"model": "smollm2", "prompt": "hi", "max_tokens": 3},
    "/v1/messages": {"model": "smollm2", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3},
    "/v1/messages/count_tokens": {"model": "smollm2", "messages": [{"role": "user", "content": "hi"}]},
    "/tokenize": {"model": "smollm2", "prompt": "hi"},
    "/detokenize": {"model": "smollm2", "tokens": [1, 2]},
}


def deepen(case, path: str, how: str, data) -> None:
    """Mutates `case.body` as `how` says (bodies that are not objects stay as they are)."""
    if how == "as-is" or not isinstance(case.body, dict):
        return
    if how == "served-model":
        case.body["model"] = "smollm2"
    elif path in BASES and case.body:
        key = data.draw(st.sampled_from(sorted(case.body)))
        case.body = {**BASES[path], key: case.body[key]}


def _has_inputs(operation) -> bool:
    return bool(len(operation.body) or len(operation.path_parameters) or len(operation.query))


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
def test_no_server_errors(fuzz_server, fuzz_schema, mode):
    """Every operation, cases that fit its schema (positive) and cases that break it (negative)."""
    unbreakable = []
    for operation in _operations(fuzz_schema):
        if mode is GenerationMode.NEGATIVE and not _has_inputs(operation):
            continue  # nothing to break: GET /health takes no input

        @settings(
            max_examples=MAX_EXAMPLES,
            derandomize=True,
            deadline=None,
            database=None,
            suppress_health_check=list(HealthCheck),
            phases=[Phase.explicit, Phase.generate],
        )
        @given(case=operation.as_strategy(generation_mode=mode), how=st.sampled_from(HOW), data=st.data())
        def call(case, how: str, data) -> None:
            deepen(case, case.operation.path, how, data)
            response = case.call(base_url=fuzz_server.base_url, timeout=120)
            assert response.status_code < 500, (
                f"{case.method} {case.path} -> {response.status_code}: {response.text[:500]}\n{case.as_curl_command()}"
            )

        try:
            call()
        except Unsatisfiable:
            unbreakable.append(operation.label)
    # An operation whose only input is a free-form string path parameter has no invalid
    # value; everything else was broken.
    free_form = {"GET /v1/models/{model_id}", "GET /v1/responses/{response_id}", "DELETE /v1/responses/{response_id}"}
    assert set(unbreakable) <= free_form, unbreakable


def test_still_serves_after_fuzzing(fuzz_server):
    """Runs after the fuzz test in file order: the fuzz reached generation (a control: a fuzz
    stopped at the model check would pass vacuously), and the engine still generates."""
    page = httpx.get(f"{fuzz_server.base_url}/metrics", timeout=30).text
    generated = re.findall(r'agentkv_requests_total\{endpoint="/v1/(?:chat/)?completions",status="200"\} (\S+)', page)
    assert sum(map(float, generated)) >= 1, page
    r = httpx.post(
        f"{fuzz_server.base_url}/v1/chat/completions",
        timeout=120,
        json={"model": "smollm2", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]},
    )
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["finish_reason"] in {"length", "stop"}
    assert httpx.get(f"{fuzz_server.base_url}/health", timeout=30).status_code == 200

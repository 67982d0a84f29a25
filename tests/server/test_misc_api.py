"""Models, tokenize/detokenize, embeddings, metrics, health while loading, OpenAPI schema."""

from __future__ import annotations

import base64
import threading
import time

import httpx
import numpy as np
import pytest

from agentkv.runtime.async_engine import AsyncEngine
from agentkv.server.app import create_app

pytestmark = pytest.mark.slow


def test_models(client):
    models = client.models.list()
    assert [m.id for m in models.data] == ["smollm2"]
    assert client.models.retrieve("smollm2").id == "smollm2"


def test_tokenize_round_trip(http):
    text = "Hello, world! Ünïcode ✓"
    tok = http.post("/tokenize", json={"prompt": text, "add_special_tokens": False}).json()
    assert tok["count"] == len(tok["tokens"]) and tok["max_model_len"] == 1024
    assert http.post("/detokenize", json={"tokens": tok["tokens"]}).json() == {"prompt": text}
    chat = http.post("/tokenize", json={"messages": [{"role": "user", "content": "hi"}]}).json()
    assert chat["count"] > tok["count"] // 2


def test_metrics_scrape(client, http):
    client.chat.completions.create(model="smollm2", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    text = http.get("/metrics").text
    for name in (
        "agentkv_requests_total",
        "agentkv_request_latency_seconds_bucket",
        "agentkv_time_to_first_token_seconds_bucket",
        "agentkv_inter_token_latency_seconds_bucket",
        "agentkv_prompt_tokens_total",
        "agentkv_generation_tokens_total",
        "agentkv_prefix_cache_queried_tokens_total",
        "agentkv_prefix_cache_hit_tokens_total",
        "agentkv_kv_blocks_used",
        "agentkv_kv_blocks_free",
        "agentkv_num_requests_running",
        "agentkv_num_requests_waiting",
        "agentkv_spec_drafted_tokens_total",
        "agentkv_spec_accepted_tokens_total",
    ):
        assert name in text, name
    assert 'endpoint="/v1/chat/completions",status="200"' in text


def test_openapi_matches_the_api(http):
    schema = http.get("/openapi.json").json()
    for path in (
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/embeddings",
        "/v1/models",
        "/tokenize",
        "/detokenize",
        "/health",
    ):
        assert path in schema["paths"], path
    chat = schema["paths"]["/v1/chat/completions"]["post"]
    assert "422" not in chat["responses"] and "400" in chat["responses"]
    props = schema["components"]["schemas"]["ChatCompletionRequest"]["properties"]
    assert {"messages", "tools", "tool_choice", "response_format", "logprobs", "stream_options"} <= set(props)


def test_health_is_503_while_loading(server_tools):
    release = threading.Event()

    def load():  # an engine of its own: the app owns what its loader built and shuts it down
        release.wait(60)
        return AsyncEngine.from_model("smollm2", max_model_len=256, kv_cache_blocks=32)

    server, base = server_tools.start(create_app(load, served_model_name="smollm2"), wait_ready=False)
    try:
        assert httpx.get(f"{base}/health").json()["status"] == "loading"
        r = httpx.post(
            f"{base}/v1/chat/completions", json={"model": "smollm2", "messages": [{"role": "user", "content": "hi"}]}
        )
        assert r.status_code == 503 and r.json()["error"]["code"] == "model_loading"
        release.set()
        deadline = time.monotonic() + 120
        while httpx.get(f"{base}/health").status_code != 200 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert httpx.get(f"{base}/health").json()["status"] == "ok"
    finally:
        release.set()
        server.should_exit = True


def test_embeddings(minilm_server, server_tools):
    client = server_tools.client(minilm_server)
    # The SDK asks for base64 unless told, and validates before decoding it: say "float".
    r = client.embeddings.create(model="minilm", input=["a cat", "a kitten", "stock prices"], encoding_format="float")
    vecs = np.array([d.embedding for d in r.data])
    assert vecs.shape == (3, 384) and np.allclose(np.linalg.norm(vecs, axis=1), 1, atol=1e-4)
    assert vecs[0] @ vecs[1] > vecs[0] @ vecs[2]
    assert r.usage.prompt_tokens > 0
    b64 = httpx.post(
        f"{minilm_server.base_url}/v1/embeddings",
        json={"model": "minilm", "input": "a cat", "encoding_format": "base64"},
    ).json()
    decoded = np.frombuffer(base64.b64decode(b64["data"][0]["embedding"]), dtype=np.float32)
    assert np.allclose(decoded, vecs[0], atol=1e-6)


def test_chat_on_embedding_model_is_400(minilm_server):
    r = httpx.post(
        f"{minilm_server.base_url}/v1/chat/completions",
        json={"model": "minilm", "messages": [{"role": "user", "content": "hi"}]},
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == "model"

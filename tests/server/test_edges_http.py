"""The promise at its edges, over real HTTP: request limits answered with the API's own 400,
/metrics behind the keys, and a tenant's cache flushed whole without touching another's."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import anthropic
import httpx
import openai
import pytest

from agentkv.server.app import create_app
from agentkv.server.lifecycle import ServerLimits
from tests.server.conftest import LiveServer, serve

KEYS = {"key-a": "team-a", "key-b": "team-b"}
ADMIN = "admin-key"


@pytest.fixture(scope="module")
def keyed(smollm2_engine) -> Iterator[LiveServer]:
    app = create_app(smollm2_engine, api_key=KEYS, served_model_name="smollm2", limits=ServerLimits(admin_key=ADMIN))
    yield from serve(app, smollm2_engine)


def cached(server: LiveServer, key: str, prompt: str) -> int:
    client = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key=key, max_retries=0, timeout=300)
    r = client.completions.create(model="smollm2", prompt=prompt, max_tokens=1, temperature=0)
    return r.usage.prompt_tokens_details.cached_tokens


def fresh_prompt() -> str:
    return f"Flush probe {uuid.uuid4().hex}. " + "A tool result line that fills several KV blocks. " * 8


def test_a_stop_list_past_the_limits_is_a_400(client):
    huge = ["x" * 1000 + str(i) for i in range(4000)]  # ~4 MB of stop strings
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model="smollm2", prompt="Hi", max_tokens=4, stop=huge)
    assert err.value.status_code == 400 and "at most 64 stop strings" in err.value.message
    with pytest.raises(openai.BadRequestError, match="at most 1024 characters"):
        client.completions.create(model="smollm2", prompt="Hi", max_tokens=4, stop=["y" * 5000])
    ok = client.completions.create(model="smollm2", prompt="Hi", max_tokens=4, stop=["\n", "</s>", "User:"])
    assert ok.choices[0].finish_reason in ("stop", "length")


def test_more_cache_control_blocks_than_anthropic_allows_is_its_400(smollm2_server):
    client = anthropic.Anthropic(base_url=smollm2_server.base_url, api_key="unused", max_retries=0)
    blocks = [{"type": "text", "text": f"part {i}", "cache_control": {"type": "ephemeral"}} for i in range(100)]
    with pytest.raises(anthropic.BadRequestError) as err:
        client.messages.create(model="smollm2", max_tokens=4, messages=[{"role": "user", "content": blocks}])
    assert "A maximum of 4 blocks with cache_control may be provided. Found 100." in err.value.message
    assert err.value.body["type"] == "error" and err.value.body["error"]["type"] == "invalid_request_error"
    four = client.messages.create(model="smollm2", max_tokens=2, messages=[{"role": "user", "content": blocks[:4]}])
    assert four.usage.input_tokens + four.usage.cache_read_input_tokens + four.usage.cache_creation_input_tokens > 0


def test_metrics_need_a_key_when_keys_are_set(keyed, smollm2_engine):
    assert httpx.get(f"{keyed.base_url}/metrics").status_code == 401
    assert httpx.get(f"{keyed.base_url}/metrics", headers={"Authorization": "Bearer key-b"}).status_code == 200
    public = create_app(smollm2_engine, api_key=KEYS, limits=ServerLimits(public_metrics=True))
    for server in serve(public, smollm2_engine):
        assert httpx.get(f"{server.base_url}/metrics").status_code == 200


def test_a_tenant_flushes_its_own_cache_and_the_admin_any(keyed):
    prompt = fresh_prompt()
    for key in ("key-a", "key-b"):
        assert cached(keyed, key, prompt) == 0
        assert cached(keyed, key, prompt) > 0
    url = f"{keyed.base_url}/flush_cache"
    denied = httpx.post(url, params={"tenant": "team-b"}, headers={"Authorization": "Bearer key-a"})
    assert denied.status_code == 403
    assert httpx.post(url).status_code == 401
    flushed = httpx.post(url, headers={"Authorization": "Bearer key-a"})
    assert flushed.status_code == 200 and flushed.json()["tenant"] == "team-a" and flushed.json()["freed_blocks"] > 0
    assert cached(keyed, "key-a", prompt) == 0  # A's cache is gone ...
    assert cached(keyed, "key-b", prompt) > 0  # ... B's is not
    admin = httpx.post(f"{keyed.base_url}/reset_prefix_cache", headers={"Authorization": f"Bearer {ADMIN}"})
    assert admin.status_code == 200 and admin.json()["tenant"] is None
    assert cached(keyed, "key-b", prompt) == 0

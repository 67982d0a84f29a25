"""Tenants cannot see each other's cache: each API key its own radix namespace (so
cached_tokens never reveals another tenant's prompt), cache_salt narrows it further, and
both key headers work on every route."""

from __future__ import annotations

import argparse
import uuid
from collections.abc import Iterator

import httpx
import openai
import pytest

from agentkv.commands import serve as serve_command
from agentkv.server.app import create_app
from tests.server.conftest import LiveServer, serve

pytestmark = pytest.mark.slow

KEYS = {"key-a": None, "key-b": None, "key-c1": "team-c", "key-c2": "team-c"}


@pytest.fixture(scope="module")
def tenant_server(smollm2_engine) -> Iterator[LiveServer]:
    yield from serve(create_app(smollm2_engine, api_key=KEYS, served_model_name="smollm2"), smollm2_engine)


def cached(server: LiveServer, key: str, prompt: str, **extra) -> int:
    client = openai.OpenAI(
        base_url=f"{server.base_url}/v1", api_key=key, max_retries=0, timeout=300, _strict_response_validation=True
    )
    r = client.completions.create(model="smollm2", prompt=prompt, max_tokens=1, temperature=0, extra_body=extra or None)
    return r.usage.prompt_tokens_details.cached_tokens


def fresh_prompt() -> str:
    """Long enough to fill several KV blocks, unique to this run so no earlier test cached it."""
    return f"Tenant probe {uuid.uuid4().hex}. " + "The quick brown fox jumps over the dog. " * 8


def test_another_tenants_prompt_is_never_a_hit(tenant_server):
    prompt = fresh_prompt()
    assert cached(tenant_server, "key-a", prompt) == 0
    assert cached(tenant_server, "key-b", prompt) == 0
    assert cached(tenant_server, "key-a", prompt) > 0  # the control: A's own prompt is a hit
    assert cached(tenant_server, "key-b", prompt) > 0


def test_keys_of_one_tenant_share_and_cache_salt_narrows(tenant_server):
    prompt = fresh_prompt()
    assert cached(tenant_server, "key-c1", prompt) == 0
    assert cached(tenant_server, "key-c2", prompt) > 0  # same tenant name, same cache
    assert cached(tenant_server, "key-c1", prompt, cache_salt="s1") == 0
    assert cached(tenant_server, "key-c1", prompt, cache_salt="s1") > 0
    assert cached(tenant_server, "key-c1", prompt, cache_salt="s2") == 0


def test_both_key_headers_on_every_route(tenant_server):
    base = tenant_server.base_url
    body = {"model": "smollm2", "prompt": "hi", "max_tokens": 1}
    for path, method, json in (
        ("/v1/models", "GET", None),
        ("/v1/completions", "POST", body),
        ("/tokenize", "POST", {"prompt": "hi"}),
    ):
        for headers in ({"Authorization": "Bearer key-b"}, {"x-api-key": "key-b"}):
            assert httpx.request(method, base + path, json=json, headers=headers, timeout=300).status_code == 200, (
                path,
                headers,
            )
        assert (
            httpx.request(method, base + path, json=json, headers={"x-api-key": "nope"}, timeout=300).status_code == 401
        )
    r = httpx.post(
        f"{base}/v1/completions", json={**body, "cache_salt": ""}, headers={"x-api-key": "key-a"}, timeout=300
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == "cache_salt"


def test_serve_keeps_every_api_key(tmp_path):
    keys_file = tmp_path / "keys"
    keys_file.write_text("# tenants\nk3 team-x\n\nk4   # its own tenant\n")
    parser = argparse.ArgumentParser()
    serve_command.add_arguments(parser)
    args = parser.parse_args(["smollm2", "--api-key", "k1", "--api-key", "k2", "--api-keys-file", str(keys_file)])
    assert serve_command.api_keys(args) == {"k1": None, "k2": None, "k3": "team-x", "k4": None}
    keys_file.write_text("k1 a b\n")
    with pytest.raises(ValueError, match=r"keys:1 has more than"):
        serve_command.api_keys(args)

"""The per-request speculation opt-out over real HTTP: `disable_speculative_decoding: true` on
/v1/chat/completions and /v1/completions drafts nothing (the server's drafted-token counter
stays put) and gives the same tokens; a non-boolean is a 400 naming the field."""

from __future__ import annotations

import re
from collections.abc import Iterator

import httpx
import pytest

from agentkv.runtime.async_engine import AsyncEngine
from agentkv.server.app import create_app
from tests.server.conftest import serve

FIELD = "disable_speculative_decoding"
# Copy-heavy: the answer repeats a list the prompt holds, so the n-gram drafter has matches.
LISTING = ", ".join(f"item_{i} = {i * 7 % 13}" for i in range(24))
CHAT = [{"role": "user", "content": f"Repeat this list exactly, nothing else:\n{LISTING}"}]
PROMPT = f"Config:\n{LISTING}\nThe same config again:\n{LISTING[:40]}"


@pytest.fixture(scope="module")
def spec_http() -> Iterator[httpx.Client]:
    engine = AsyncEngine.from_model(
        "smollm2", max_model_len=1024, kv_cache_blocks=256, speculative="ngram", num_speculative_tokens=4
    )
    engine.start()
    for server in serve(create_app(engine, served_model_name="smollm2"), engine):
        with httpx.Client(base_url=server.base_url, timeout=300) as c:
            yield c


def drafted(http: httpx.Client) -> float:
    text = http.get("/metrics").text
    return float(re.search(r"^agentkv_spec_drafted_tokens_total (\S+)$", text, re.M).group(1))


def generate(http: httpx.Client, path: str, body: dict) -> tuple[list[str], float]:
    """The response's tokens (logprob entries, so equal text cannot hide different tokens)
    and how many tokens the server drafted meanwhile."""
    before = drafted(http)
    r = http.post(path, json={"model": "smollm2", "temperature": 0, "max_tokens": 32, **body})
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    if path.endswith("chat/completions"):
        tokens = [t["token"] for t in choice["logprobs"]["content"]]
    else:
        tokens = choice["logprobs"]["tokens"]
    return tokens, drafted(http) - before


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/chat/completions", {"messages": CHAT, "logprobs": True}),
        ("/v1/completions", {"prompt": PROMPT, "logprobs": 0}),
    ],
    ids=["chat", "completions"],
)
def test_opt_out_drafts_nothing_and_gives_the_same_tokens(spec_http, path, body):
    off_tokens, off_drafted = generate(spec_http, path, {**body, FIELD: True})
    on_tokens, on_drafted = generate(spec_http, path, body)
    assert off_drafted == 0
    assert on_drafted > 0  # control: this server does draft for the same request without the field
    assert off_tokens == on_tokens
    assert len(off_tokens) == 32


@pytest.mark.parametrize("value", ["true", 1, 0, [True]])
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_non_boolean_opt_out_is_a_400_naming_the_field(spec_http, path, value):
    body = {"messages": CHAT} if "chat" in path else {"prompt": PROMPT}
    r = spec_http.post(path, json={"model": "smollm2", "max_tokens": 1, FIELD: value, **body})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == FIELD
    assert FIELD in error["message"]

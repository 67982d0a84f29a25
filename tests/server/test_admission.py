"""Admission control over real HTTP: one running slot and one queued; beyond that a 429 in
OpenAI's rate_limit_error shape with Retry-After (the openai client retries it by itself); a
stream answers at once, sends keep-alives while it waits, and a client that leaves while
still queued costs no prefill."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import httpx
import openai
import pytest

from agentkv.runtime.async_engine import AsyncEngine
from agentkv.server.app import create_app
from agentkv.server.lifecycle import ServerLimits
from tests.server.conftest import LiveServer, serve

pytestmark = pytest.mark.slow

NO_EOS = {"0": -100, "2": -100}  # smollm2's EOS ids: the answer runs to max_tokens
LONG = {
    "model": "smollm2",
    "prompt": [1, 2, 3, 4, 5, 6, 7, 8],
    "max_tokens": 400,
    "temperature": 0,
    "logit_bias": NO_EOS,
    "stream": True,
}


@pytest.fixture(scope="module")
def one_slot() -> Iterator[LiveServer]:
    """max_num_seqs=1 and max_queued_requests=1; no prefix cache, so every prompt token a
    request gets is computed (and counted) by the engine."""
    engine = AsyncEngine.from_model(
        "smollm2",
        max_model_len=1024,
        kv_cache_blocks=128,
        max_num_seqs=1,
        max_queued_requests=1,
        enable_prefix_cache=False,
    )
    app = create_app(engine, served_model_name="smollm2", limits=ServerLimits(sse_keepalive_s=0.2))
    yield from serve(app, engine)


def settle(engine) -> None:
    deadline = time.monotonic() + 60
    while engine.num_in_flight or engine.stats().num_running or engine.stats().num_waiting:
        assert time.monotonic() < deadline, engine.stats()
        time.sleep(0.02)


def wait_for(check, what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


def test_beyond_the_queue_a_429_that_the_client_retries(one_slot):
    engine = one_slot.engine
    settle(engine)
    chat = {"model": "smollm2", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    with httpx.Client(base_url=one_slot.base_url, timeout=60) as c:
        with (
            c.stream("POST", "/v1/completions", json=LONG) as running,
            c.stream("POST", "/v1/completions", json=LONG) as queued,
        ):
            assert running.status_code == 200 and queued.status_code == 200
            r = c.post("/v1/chat/completions", json=chat)
            assert r.status_code == 429 and r.headers["retry-after"] == "1"
            assert r.json()["error"]["type"] == "rate_limit_error"
            with pytest.raises(openai.RateLimitError):
                openai.OpenAI(base_url=f"{one_slot.base_url}/v1", api_key="x", max_retries=0).chat.completions.create(
                    **chat
                )
            statuses: list[int] = []
            hooks = {"response": [lambda resp: statuses.append(resp.status_code)]}
            retrying = openai.OpenAI(
                base_url=f"{one_slot.base_url}/v1",
                api_key="x",
                max_retries=8,
                http_client=httpx.Client(event_hooks=hooks, timeout=120),
            )
            result: list = []
            worker = threading.Thread(target=lambda: result.append(retrying.chat.completions.create(**chat)))
            worker.start()
            wait_for(lambda: 429 in statuses, "the retrying client saw no 429")
        # both streams closed: their slots free, the client's next retry gets in
        worker.join(60)
    assert statuses[0] == 429 and statuses[-1] == 200
    assert result and result[0].choices[0].message is not None


def test_a_stream_answers_at_once_and_keeps_alive_while_queued(one_slot):
    engine = one_slot.engine
    settle(engine)
    chat = {"model": "smollm2", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "stream": True}
    with (
        httpx.Client(base_url=one_slot.base_url, timeout=60) as c,
        c.stream("POST", "/v1/completions", json=LONG) as running,
    ):
        wait_for(lambda: engine.stats().num_running == 1, "the first request never ran")
        with c.stream("POST", "/v1/chat/completions", json=chat) as waiting:
            lines = waiting.iter_lines()
            first = next(lines)
            assert first.startswith("data: ") and '"role":"assistant"' in first
            wait_for(lambda: engine.stats().num_waiting == 1, "not queued")  # no token yet
            assert [next(lines) for _ in range(4)].count(": keep-alive") >= 1
        assert running.status_code == 200


def test_a_client_that_leaves_while_queued_costs_no_prefill(one_slot):
    engine = one_slot.engine
    settle(engine)
    before = engine.stats()
    queued_prompt = list(range(100, 400))  # 300 tokens: their prefill would show
    with (
        httpx.Client(base_url=one_slot.base_url, timeout=60) as c,
        c.stream("POST", "/v1/completions", json=LONG) as running,
    ):
        wait_for(lambda: engine.stats().num_running == 1, "the first request never ran")
        with c.stream("POST", "/v1/completions", json={**LONG, "prompt": queued_prompt}) as queued:
            assert queued.status_code == 200
            wait_for(lambda: engine.stats().num_waiting == 1, "the second request never queued")
        wait_for(lambda: engine.stats().num_waiting == 0, "the queued request was not freed")
        assert running.status_code == 200
    settle(engine)
    after = engine.stats()
    assert after.prompt_tokens - before.prompt_tokens == 8 + 300  # both reached the engine
    generated = after.generation_tokens - before.generation_tokens
    # Only the running request was computed: its 8 prompt tokens, then one row per token
    # it sampled after the first. A prefill of the queued one would add up to 300.
    assert after.computed_tokens - before.computed_tokens == 8 + generated - 1
    assert after.kv_blocks_used == 0 and after.kv_blocks_free == 128

"""AsyncEngine's inbox: typed messages, applied by the engine thread; an unknown one is a bug
that stops the engine loudly, never a message silently dropped."""

from __future__ import annotations

import asyncio
import time

import pytest

from agentkv.runtime.async_engine import AbortRequest, AddRequest, AsyncEngine, Shutdown
from agentkv.runtime.client import EngineClient
from agentkv.runtime.config import engine_config
from agentkv.runtime.errors import EngineDeadError
from agentkv.runtime.params import SamplingParams
from tests.runtime.test_exactness import qwen2_dir, tokens  # noqa: F401

GREEDY = SamplingParams(max_tokens=4, temperature=0.0)


@pytest.fixture
def engine(qwen2_dir):  # noqa: F811
    eng = AsyncEngine.from_config(engine_config(qwen2_dir, kv_cache_blocks=64))
    eng.start()
    yield eng
    asyncio.run(eng.shutdown())


async def collect(engine: AsyncEngine, rid: str, prompt: list[int]) -> list:
    return [out async for out in engine.generate(rid, prompt, GREEDY)]


def wait_dead(engine: AsyncEngine, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while engine.is_alive and time.monotonic() < deadline:
        time.sleep(0.01)


def test_async_engine_is_an_engine_client(engine):
    assert isinstance(engine, EngineClient)
    assert not isinstance(object(), EngineClient)


def test_requests_stream_to_the_end_through_typed_messages(engine):
    outs = asyncio.run(collect(engine, "a", tokens(20, 1, 256)))
    assert outs[-1].finished and outs[-1].num_tokens == 4 and sum(len(o.token_ids) for o in outs) == 4
    assert engine.is_alive


def test_known_messages_keep_the_engine_alive(engine):
    """The control for the test below: the same path with known messages does not stop it."""
    engine._send(AbortRequest("nobody"))
    engine._send(AddRequest("bad", [], GREEDY))  # refused by the engine, delivered to no stream
    outs = asyncio.run(collect(engine, "b", tokens(10, 2, 256)))
    assert outs[-1].finished and engine.is_alive


def test_an_unknown_message_is_a_bug_not_dropped(engine):
    engine._send(("abort", "b"))  # the old tuple form: no longer a message
    wait_dead(engine)
    assert not engine.is_alive
    assert isinstance(engine._dead, RuntimeError)
    assert "unknown engine message ('abort', 'b') (a bug)" in str(engine._dead)
    with pytest.raises(EngineDeadError, match="unknown engine message"):
        asyncio.run(collect(engine, "c", tokens(10, 3, 256)))


def test_shutdown_is_a_message_the_thread_obeys(qwen2_dir):  # noqa: F811
    eng = AsyncEngine.from_config(engine_config(qwen2_dir, kv_cache_blocks=64))
    eng.start()
    thread = eng._thread
    eng._send(Shutdown())
    thread.join(10)
    assert not thread.is_alive() and eng.is_alive  # stopped on request, not dead

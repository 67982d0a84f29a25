"""Health tells the truth and the exit code tells a supervisor: once the engine thread dies,
/health is 503, requests in flight and new ones get 503, and `agentkv serve` exits 1; a KV
pool too small for an explicit --max-model-len exits 2 at start; a small pool without one
clamps max_model_len, refuses what cannot fit with a 400 and goes on serving."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import threading
import time

import httpx
import pytest

from agentkv.commands.ports import free_port
from agentkv.commands.serve import serve_app
from agentkv.runtime.async_engine import AsyncEngine
from agentkv.runtime.config import engine_config
from agentkv.runtime.errors import EngineDeadError
from agentkv.runtime.params import SamplingParams
from agentkv.server.app import create_app
from tests.runtime.test_exactness import qwen2_dir  # noqa: F401
from tests.server.conftest import start_server

pytestmark = pytest.mark.slow

LONG = {
    "model": "smollm2",
    "prompt": [1, 2, 3, 4, 5, 6, 7, 8],
    "max_tokens": 400,
    "temperature": 0,
    "logit_bias": {"0": -100, "2": -100},
    "stream": True,
}


def kill(engine: AsyncEngine) -> None:
    """A real engine-thread failure: a message the thread does not know is a bug it dies of."""
    engine._send(object())
    deadline = time.monotonic() + 30
    while engine.is_alive:
        assert time.monotonic() < deadline, "the engine thread did not die"
        time.sleep(0.01)


def error_events(lines_of_stream) -> list[dict]:
    lines = [line[6:] for line in lines_of_stream if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [e for e in map(json.loads, lines[:-1]) if "error" in e]


def new_engine() -> AsyncEngine:
    return AsyncEngine.from_model("smollm2", max_model_len=1024, kv_cache_blocks=128)


def test_health_is_503_once_the_engine_died_and_requests_get_503():
    engine = new_engine()
    server, base = start_server(create_app(engine, served_model_name="smollm2"))
    try:
        assert httpx.get(f"{base}/health").status_code == 200  # the control
        with httpx.stream("POST", f"{base}/v1/completions", json=LONG, timeout=60) as r:
            lines = r.iter_lines()
            next(lines)  # the first token is out: the request is running
            kill(engine)
            [event] = error_events(lines)
        assert event["error"]["type"] == "service_unavailable" and event["error"]["code"] == "engine_dead"
        health = httpx.get(f"{base}/health")
        assert health.status_code == 503 and health.json()["status"] == "failed"
        late = httpx.post(f"{base}/v1/completions", json={**LONG, "stream": False}, timeout=10)
        assert late.status_code == 503 and late.json()["error"]["code"] == "engine_dead"
        late = httpx.post(f"{base}/v1/completions", json=LONG, timeout=10)  # a stream, too
        assert late.status_code == 503
    finally:
        server.should_exit = True


def test_serve_exits_1_after_failing_the_requests_in_flight():
    engine, port = new_engine(), free_port()
    codes: list[int] = []
    thread = threading.Thread(
        target=lambda: codes.append(
            serve_app(
                lambda on_fatal: create_app(engine, served_model_name="smollm2", on_fatal=on_fatal),
                host="127.0.0.1",
                port=port,
                log_level="warning",
            )
        )
    )
    thread.start()
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            if httpx.get(f"{base}/health").status_code == 200:
                break
        except httpx.TransportError:
            assert time.monotonic() < deadline
            time.sleep(0.05)
    with httpx.stream("POST", f"{base}/v1/completions", json=LONG, timeout=60) as r:
        lines = r.iter_lines()
        next(lines)
        kill(engine)
        [event] = error_events(lines)
    assert event["error"]["code"] == "engine_dead"
    thread.join(30)
    assert not thread.is_alive() and codes == [1]


def cli(*args: str, port: int) -> subprocess.Popen:
    return subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys; from agentkv.cli import main; sys.exit(main())",
            "serve",
            "smollm2",
            "--port",
            str(port),
            "--log-level",
            "warning",
            *args,
        ],
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


def test_a_pool_too_small_for_an_explicit_max_model_len_exits_2():
    proc = cli("--kv-cache-blocks", "8", "--max-model-len", "1024", port=free_port())
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 2, err
    assert "agentkv serve:" in err and "--kv-cache-blocks" in err and "1024" in err


def test_a_small_pool_clamps_refuses_what_cannot_fit_and_serves_on():
    """The reported repro: --kv-cache-blocks 8 (128 tokens), max_tokens 400 -> a 400, and then
    a normal request, whose default max_tokens is what the pool has room for, succeeds."""
    port = free_port()
    proc = cli("--kv-cache-blocks", "8", port=port)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while True:
            assert proc.poll() is None and time.monotonic() < deadline
            try:
                if httpx.get(f"{base}/health").status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.2)
        body = {"model": "smollm2", "prompt": "Once upon a time", "temperature": 0}
        r = httpx.post(f"{base}/v1/completions", json={**body, "max_tokens": 400}, timeout=300)
        assert r.status_code == 400 and "128" in r.json()["error"]["message"], r.text
        r = httpx.post(f"{base}/v1/completions", json={**body, "max_tokens": 8}, timeout=300)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] > 0
        r = httpx.post(f"{base}/v1/completions", json=body, timeout=300)  # no max_tokens at all
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["total_tokens"] <= 128
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=60)
    assert "max_model_len clamped to 128 tokens" in err


def test_streams_racing_the_engine_death_all_end(qwen2_dir):  # noqa: F811
    """Requests admitted while the engine thread dies each end (outputs or EngineDeadError),
    none waits forever; once it is dead, admission itself raises, before anything is awaited."""
    engine = AsyncEngine.from_config(engine_config(qwen2_dir, kv_cache_blocks=64))
    engine.start()
    params = SamplingParams(max_tokens=2, temperature=0.0)

    async def drain(stream) -> None:
        with contextlib.suppress(EngineDeadError):
            async for _ in stream:
                pass

    async def race() -> int:
        streams = []
        threading.Timer(0.05, engine._send, (object(),)).start()
        while len(streams) < 5000:
            try:
                streams.append(engine.generate(None, [1, 2, 3], params))
            except EngineDeadError:
                break
            await asyncio.sleep(0)
        await asyncio.wait_for(asyncio.gather(*(drain(s) for s in streams)), 30)
        return len(streams)

    assert asyncio.run(race()) > 0 and not engine.is_alive


def test_after_shutdown_requests_are_refused_not_left_waiting(qwen2_dir):  # noqa: F811
    engine = AsyncEngine.from_config(engine_config(qwen2_dir, kv_cache_blocks=64))
    engine.start()

    async def after_shutdown() -> None:
        await engine.shutdown()
        with pytest.raises(EngineDeadError, match="shut down"):
            engine.generate(None, [1, 2, 3], SamplingParams(max_tokens=2))

    asyncio.run(after_shutdown())

"""The routes SGLang's router reads from a worker, on a real smollm2 engine in-process (the
portable torch backend: no kernel build): server and model info, load, health_generate, the
fields the router adds to every request, and /health once the engine has stopped."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from agentkv.commands.cluster import ClusterSpec, router_command, worker_flags
from agentkv.runtime.async_engine import AsyncEngine
from agentkv.runtime.params import SamplingParams
from agentkv.server.app import create_app

ROUTER_CHAT_FIELDS = {
    "no_stop_trim": False,
    "continue_final_message": False,
    "separate_reasoning": True,
    "stream_reasoning": True,
    "return_hidden_states": False,
}


@pytest.fixture(scope="module")
def engine() -> Iterator[AsyncEngine]:
    eng = AsyncEngine.from_model("smollm2", backend="torch", max_model_len=512, kv_cache_blocks=64)
    yield eng


@pytest.fixture(scope="module")
def client(engine) -> Iterator[TestClient]:
    with TestClient(create_app(engine, served_model_name="smollm2")) as c:
        yield c


def test_server_and_model_info_under_both_names(client) -> None:
    for path in ("/server_info", "/get_server_info"):
        info = client.get(path).json()
        assert (info["served_model_name"], info["tp_size"], info["dp_size"]) == ("smollm2", 1, 1)
        assert info["model_path"]
    for path in ("/model_info", "/get_model_info"):
        assert client.get(path).json()["is_generation"] is True


def test_load_counts_live_requests(client, engine) -> None:
    idle = client.get("/get_load").json()
    assert idle == [{"dp_rank": 0, "num_reqs": 0, "num_waiting_reqs": 0, "num_tokens": 0}]
    started, release = threading.Event(), threading.Event()

    async def hold() -> None:
        ids = engine.tokenizer.encode("Count slowly from one to one hundred:", True)
        gen = engine.generate(None, ids, SamplingParams(max_tokens=200, temperature=0.0, ignore_eos=True))
        await gen.__anext__()
        started.set()
        while not release.is_set():
            await asyncio.sleep(0.01)
        await gen.aclose()  # aborts the request

    runner = threading.Thread(target=lambda: asyncio.run(hold()))
    runner.start()
    try:
        assert started.wait(120)
        busy = client.get("/get_load").json()[0]
    finally:
        release.set()
        runner.join(60)
    assert busy["num_reqs"] == 1 and busy["num_tokens"] > 0, busy


def test_health_generate(client) -> None:
    resp = client.get("/health_generate")
    assert resp.status_code == 200 and resp.json()["status"] == "ok"


def test_router_added_fields_pass_and_strict_mode_sees_them(engine) -> None:
    """What the router sends: its extra fields, max_completion_tokens for max_tokens, and an
    assistant tool-call turn without `content`. The strict server is the control: it answers
    400 naming the fields, so they really reached the app."""
    body = {
        "model": "smollm2",
        "max_completion_tokens": 2,
        "temperature": 0,
        **ROUTER_CHAT_FIELDS,
        "messages": [
            {"role": "user", "content": "hi"},
            {
                "role": "assistant",
                "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "ok"},
        ],
    }
    completion = {
        "model": "smollm2",
        "prompt": "One",
        "max_tokens": 2,
        "no_stop_trim": False,
        "return_hidden_states": False,
    }
    with TestClient(create_app(engine, served_model_name="smollm2")) as lenient:
        resp = lenient.post("/v1/chat/completions", json=body)
        assert resp.status_code == 200, resp.text
        assert resp.json()["usage"]["completion_tokens"] <= 2
        assert lenient.post("/v1/completions", json=completion).status_code == 200
    with TestClient(create_app(engine, served_model_name="smollm2", strict_request_fields=True)) as strict:
        resp = strict.post("/v1/chat/completions", json=body)
        assert resp.status_code == 400 and "no_stop_trim" in resp.json()["error"]["message"]


def test_worker_routes_take_the_api_key(engine) -> None:
    with TestClient(create_app(engine, api_key="k", served_model_name="smollm2")) as keyed:
        assert keyed.get("/get_load").status_code == 401
        assert keyed.get("/get_load", headers={"authorization": "Bearer k"}).status_code == 200


def test_health_is_503_once_the_engine_stopped() -> None:
    eng = AsyncEngine.from_model("smollm2", backend="torch", max_model_len=256, kv_cache_blocks=16)
    with TestClient(create_app(eng, served_model_name="smollm2")) as c:
        assert c.get("/health").status_code == 200
        eng._dead = RuntimeError("step failed")  # what the engine loop records when it dies
        resp = c.get("/health")
        assert resp.status_code == 503 and resp.json()["status"] == "failed"


def test_cluster_command_lines() -> None:
    import argparse

    from agentkv.commands.cluster import add_arguments

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(
        ["smollm2", "--replicas", "3", "--max-model-len", "1024", "--no-prefix-cache", "--host", "127.0.0.2"]
    )
    assert worker_flags(args) == ["--max-model-len", "1024", "--no-prefix-cache"]
    spec = ClusterSpec(model="smollm2", replicas=3, host="127.0.0.2", router_port=40000)
    cmd = router_command(spec)
    assert cmd[cmd.index("--host") + 1] == cmd[cmd.index("--prometheus-host") + 1] == "127.0.0.2"
    assert cmd[cmd.index("--prometheus-port") + 1] == "40004"
    assert spec.worker_urls == [f"http://127.0.0.2:{p}" for p in (40001, 40002, 40003)]
    with pytest.raises(ValueError, match="replicas=0"):
        ClusterSpec(model="smollm2", replicas=0)
    with pytest.raises(ValueError, match="policy='fastest'"):
        ClusterSpec(model="smollm2", policy="fastest")

"""What the router hashes carries the adapter: two tiny-llama workers (in-process servers, each
with adapter `a`) behind the real sglang-router (cache_aware), and the cluster's front door.

Through the front, a request of adapter `a` never follows the base's routing prefix of the same
text (it lands on the other worker, and stays there), and its routing tag is gone before the
worker tokenizes (the same prompt tokens as the text sent straight to the worker). The control:
straight through the router, an adapter request of a text the base sent first follows the
base's prefix to the base's worker, whose cache cannot serve it."""

from __future__ import annotations

import threading
import time

import httpx
import pytest
import uvicorn

from agentkv.commands.cluster import ClusterSpec, launch_router
from agentkv.commands.cluster_front import front_app
from agentkv.commands.ports import free_ports
from agentkv.formats.chat_template import ChatTemplate
from agentkv.runtime.async_engine import AsyncEngine
from agentkv.server.app import create_app
from tests.cluster.conftest import needs_router
from tests.models.test_lora import peft_adapter
from tests.runtime.test_exactness import byte_level_tokenizer, tiny_hf_model
from tests.server.test_lora_api import TEMPLATE

pytestmark = [needs_router, pytest.mark.timeout(600)]
# any in-flight difference is an imbalance: the warm-up's second request goes to the idle worker
BALANCE = ("--balance-abs-threshold", "0", "--balance-rel-threshold", "1.0")


def serve_on(app, port: int) -> uvicorn.Server:
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    threading.Thread(target=server.run, daemon=True).start()
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code == 200:
                return server
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"server on port {port} did not become ready")


@pytest.fixture(scope="module")
def routed(tmp_path_factory):
    """(front URL, router URL, [(worker URL, AsyncEngine)])."""
    root = tmp_path_factory.mktemp("lora_routing")
    tiny_hf_model(root / "base", "llama", seed=5, vocab_size=256, max_position_embeddings=512)
    byte_level_tokenizer(root / "base")
    peft_adapter(root / "base", root / "a", 7, r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])
    base = free_ports(5)
    spec = ClusterSpec(
        model="tiny", replicas=2, router_port=base, metrics_port=base + 3, front_port=base + 4, router_args=BALANCE
    )
    servers, workers = [], []
    for port in spec.worker_ports:
        engine = AsyncEngine.from_model(str(root / "base"), kv_cache_blocks=128)
        engine.engine.adapters.load("a", str(root / "a"))
        engine.start()
        app = create_app(engine, served_model_name="tiny", chat_template=ChatTemplate(TEMPLATE, origin="test"))
        servers.append(serve_on(app, port))
        workers.append((f"http://127.0.0.1:{port}", engine))
    router = launch_router(spec, time.monotonic() + 300)
    try:
        servers.append(serve_on(front_app(spec.router_url), spec.front_port))
        yield spec.front_url, spec.router_url, workers
    finally:
        router.terminate()
        router.wait(timeout=15)
    for server in servers:
        server.should_exit = True


def complete(url: str, model: str, prompt: str) -> dict:
    body = {"model": model, "prompt": prompt, "max_tokens": 2, "temperature": 0}
    resp = httpx.post(url + "/v1/completions", json=body, timeout=120)
    assert resp.status_code == 200, resp.text
    return resp.json()


def served_by(workers, before: list[tuple[int, int]]) -> list[int]:
    """Which workers served a base request (prompt tokens grew) and an `a` request, since `before`."""
    now = snapshot(workers)
    return [i for i, (b, n) in enumerate(zip(before, now)) if n != b]


def snapshot(workers) -> list[tuple[int, int]]:
    return [(e.engine.stats().prompt_tokens, e.engine.adapters.usage().get("a", (0, 0))[0]) for _, e in workers]


def busy(url: str, prompt: str, engine):
    """A long request of `prompt` in flight on `engine`'s worker (the router sees the imbalance)."""
    import concurrent.futures

    pool = concurrent.futures.ThreadPoolExecutor(1)
    body = {"model": "tiny", "prompt": prompt, "max_tokens": 300, "ignore_eos": True, "temperature": 0}
    future = pool.submit(httpx.post, url + "/v1/completions", json=body, timeout=300)
    while engine.engine.stats().num_running == 0:
        time.sleep(0.005)
    pool.shutdown(wait=False)
    return future


def test_the_router_keeps_an_adapter_off_the_bases_prefix(routed):
    """The base's text T goes to worker X. While X is busy (a long request of T: the balance
    check picks the idle worker Y whatever the text), the adapter's first T goes to Y. Once
    idle, the router follows prefixes: through the front, `a`'s T follows its own prefix to Y;
    straight through the router (no tag) `a`'s T follows the base's prefix to X."""
    front, router, workers = routed
    text = "a shared agent system prompt that both the base and the adapter send " * 3
    before = snapshot(workers)
    complete(front, "tiny", text)
    (x,) = served_by(workers, before)
    long = busy(front, text, workers[x][1])
    before = snapshot(workers)
    complete(front, "a", text)
    assert served_by(workers, before) == [1 - x]
    assert long.result().status_code == 200
    before = snapshot(workers)
    tagged = [complete(front, model, text) for model in ("a", "tiny:a")]
    after = snapshot(workers)
    assert served_by(workers, before) == [1 - x] and after[1 - x][1] - before[1 - x][1] == 2
    before = snapshot(workers)
    complete(router, "a", text)  # the control: no tag, the base's prefix
    assert served_by(workers, before) == [x]
    direct = complete(workers[1 - x][0], "a", text)  # the tag never reaches the prompt
    assert [t["usage"]["prompt_tokens"] for t in tagged] == [direct["usage"]["prompt_tokens"]] * 2
    assert direct["choices"][0]["text"] == tagged[0]["choices"][0]["text"]
    chat = {"model": "a", "messages": [{"role": "user", "content": text}], "max_tokens": 2, "temperature": 0}
    via_front = httpx.post(front + "/v1/chat/completions", json=chat, timeout=120).json()
    straight = httpx.post(workers[1 - x][0] + "/v1/chat/completions", json=chat, timeout=120).json()
    assert via_front["usage"]["prompt_tokens"] == straight["usage"]["prompt_tokens"]

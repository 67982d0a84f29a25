"""agentkv workers behind the real sglang-router on loopback: registration reads the worker
contract, the router's rewritten requests pass, every port is on loopback, cache_aware keeps
an agent's turns on one worker (hit ratio, exact answers), and a killed worker leaves the
rotation without a hanging request."""

from __future__ import annotations

import json
import time
import urllib.request

import psutil
import pytest

from agentkv.bench.cluster import ReplayShape, post_chat, replay
from tests.cluster.conftest import needs_router

pytestmark = [needs_router, pytest.mark.timeout(1800)]

SHAPE = ReplayShape(agents=6, turns=4, max_tokens=4)
FULL = ReplayShape(agents=12, turns=6, max_tokens=4)


def get_json(url: str) -> object:
    with urllib.request.urlopen(url, timeout=30) as resp:
        return json.loads(resp.read())


def test_router_reads_the_load_of_every_worker(fleet) -> None:
    loads = get_json(fleet.spec.router_url + "/get_loads")
    by_url = {entry["worker"]: entry["load"] for entry in loads["workers"]}
    assert sorted(by_url) == sorted(fleet.spec.worker_urls)
    # -1 is the router's mark for a worker whose /get_load it could not read.
    assert all(load == 0 for load in by_url.values()), by_url


def test_router_rewritten_requests_pass(fleet) -> None:
    """The router adds its own fields (no_stop_trim, return_hidden_states, ...) and rewrites
    max_tokens; the request still succeeds and max_tokens still holds."""
    body = {
        "model": "smollm2",
        "max_tokens": 3,
        "temperature": 0,
        "messages": [
            {"role": "user", "content": "Say hi"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "ok"},
        ],
    }
    status, data = post_chat(fleet.spec.router_url, body)
    assert status == 200, data
    assert data["usage"]["completion_tokens"] <= 3
    req = urllib.request.Request(
        fleet.spec.router_url + "/v1/completions",
        data=json.dumps({"model": "smollm2", "prompt": "One two", "max_tokens": 2, "temperature": 0}).encode(),
        headers={"content-type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=120) as resp:
        assert json.loads(resp.read())["usage"]["completion_tokens"] <= 2


def test_every_port_binds_to_loopback(fleet) -> None:
    procs = [fleet.router, *fleet.workers]
    listening = []
    for proc in procs:
        for p in [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]:
            listening += [c.laddr for c in p.net_connections(kind="inet") if c.status == "LISTEN"]
    ports = {addr.port for addr in listening}
    assert {fleet.spec.router_port, fleet.spec.prometheus_port, *fleet.spec.worker_ports} <= ports
    assert {addr.ip for addr in listening} == {"127.0.0.1"}, listening


def _check_replay(fleet, solo, extra_router, shape: ReplayShape) -> None:
    alone = replay(solo.spec.worker_urls[0], "smollm2", shape)
    routed = replay(fleet.spec.router_url, "smollm2", shape)
    assert len(alone.ok) == len(routed.ok) == shape.agents * shape.turns
    assert routed.answers() == alone.answers()
    assert routed.cached_ratio >= 0.9 * alone.cached_ratio, (routed.cached_ratio, alone.cached_ratio)
    # Round robin over the same workers, on text none of them has seen (another seed).
    other = ReplayShape(**{**{k: getattr(shape, k) for k in shape.__dataclass_fields__}, "seed": shape.seed + 1})
    spread = replay(extra_router("round_robin"), "smollm2", other)
    assert len(spread.ok) == shape.agents * shape.turns
    # Round robin over 2 workers lands about every other turn of an agent on the worker that
    # holds its transcript: measured 0.36-0.37 against cache-aware's 0.74, so a bound of
    # exactly 2x failed by 0.002 once. 1.6x still fails a router that ignores the cache (~1x).
    assert routed.cached_ratio >= 1.6 * spread.cached_ratio, (routed.cached_ratio, spread.cached_ratio)
    print(
        f"cached ratio: solo {alone.cached_ratio:.3f}, cache_aware {routed.cached_ratio:.3f}, "
        f"round_robin {spread.cached_ratio:.3f}"
    )


def test_cache_aware_matches_one_worker(fleet, solo, extra_router) -> None:
    _check_replay(fleet, solo, extra_router, SHAPE)


@pytest.mark.slow
def test_cache_aware_matches_one_worker_full_size(fleet, solo, extra_router) -> None:
    shift = ReplayShape(**{**{k: getattr(FULL, k) for k in FULL.__dataclass_fields__}, "seed": 10})
    _check_replay(fleet, solo, extra_router, shift)


def test_killed_worker_leaves_the_rotation(fleet) -> None:
    """Kill a worker after the first turn: no request hangs (the client's timeout would show
    as status 0), each fails, if at all, with a retryable 5xx carrying an error body, and once
    the health check has run every request completes."""
    shape = ReplayShape(agents=6, turns=4, max_tokens=2, seed=20)
    killed_at = {}

    def after_turn(turn: int) -> None:
        if turn == 0:
            fleet.kill_worker(2)
            killed_at["t"] = time.monotonic()

    result = replay(fleet.spec.router_url, "smollm2", shape, timeout=240, after_turn=after_turn)
    assert len(result.replies) == shape.agents * shape.turns
    failed = [r for r in result.replies if r.status != 200]
    print(
        f"after the kill: {len(failed)} of {len(result.replies)} requests failed "
        f"(statuses {sorted({r.status for r in failed})}), slowest {max(r.seconds for r in result.replies):.1f}s"
    )
    assert all(r.status >= 500 and r.error for r in failed), failed
    assert all(r.status == 200 for r in result.replies if r.turn == shape.turns - 1), failed
    loads = get_json(fleet.spec.router_url + "/get_loads")
    live = {e["worker"] for e in loads["workers"] if e["load"] >= 0}
    assert fleet.spec.worker_urls[2] not in live and len(live) == 2, loads

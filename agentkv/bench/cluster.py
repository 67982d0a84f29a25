"""`agentkv bench cluster`: agentkv replicas behind SGLang's router on this machine — throughput
and cached-token ratio of 1, 2 and 3 workers, per-worker throughput, and the router's added
latency per request. Also the multi-agent replay the cluster tests drive.

The replay: `agents` agents share one system prompt; turn by turn, every agent appends a tool
result to its own transcript (the assistant turns are fixed text, so the transcript does not
depend on what the model answered) and asks for a short greedy answer over its whole context.
Within a turn the agents send at once, and each turn starts one agent later than the last
(turn t: agents t, t+1, ... mod agents). That rotation is what a scheduler serving agents in
turn produces, and it keeps a round-robin router from landing every agent on the same worker
by accident of the agent count: with a multiple of 3 agents and 3 workers, round_robin sends an
agent's consecutive turns to different workers (its worst case; a random arrival order is its
average case)."""

from __future__ import annotations

import argparse
import json
import random
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

WORDS = (
    "alpha bravo cedar delta ember falcon garnet harbor indigo juniper kestrel lumen "
    "marble nectar onyx pylon quartz raven sierra tundra umber velvet willow xenon yarrow "
    "zephyr"
).split()


@dataclass(frozen=True, slots=True)
class ReplayShape:
    agents: int = 12
    turns: int = 6
    system_words: int = 24
    tool_words: int = 72
    max_tokens: int = 4
    seed: int = 0


@dataclass(slots=True)
class Reply:
    """One request's outcome: HTTP status (0: no answer), answer text, token usage."""

    agent: int
    turn: int
    status: int
    text: str = ""
    prompt_tokens: int = 0
    cached_tokens: int = 0
    seconds: float = 0.0
    error: str = ""


@dataclass(slots=True)
class ReplayResult:
    replies: list[Reply] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> list[Reply]:
        return [r for r in self.replies if r.status == 200]

    @property
    def cached_ratio(self) -> float:
        prompt = sum(r.prompt_tokens for r in self.ok)
        return sum(r.cached_tokens for r in self.ok) / prompt if prompt else 0.0

    def answers(self) -> dict[tuple[int, int], str]:
        return {(r.agent, r.turn): r.text for r in self.ok}


def _words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def transcript(shape: ReplayShape, agent: int, turn: int) -> list[dict[str, str]]:
    """The messages agent `agent` sends at `turn` (a pure function of the shape)."""
    system = _words(random.Random(f"system-{shape.seed}"), shape.system_words)
    messages = [{"role": "system", "content": f"You are a terse tool-using agent. {system}"}]
    for t in range(turn + 1):
        rng = random.Random(f"{shape.seed}-{agent}-{t}")
        if t > 0:
            messages.append({"role": "assistant", "content": f"Calling tool step {t}."})
        messages.append(
            {"role": "user", "content": f"Agent {agent} turn {t} tool result: {_words(rng, shape.tool_words)}"}
        )
    return messages


def post_chat(
    url: str, body: dict[str, Any], headers: dict[str, str] | None = None, timeout: float = 300.0
) -> tuple[int, dict[str, Any]]:
    """POST /v1/chat/completions; (status, JSON body). Status 0: no HTTP answer at all."""
    req = urllib.request.Request(
        url + "/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"content-type": "application/json", **(headers or {})},
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        raw = exc.read()
        try:
            return exc.code, json.loads(raw)
        except ValueError:
            return exc.code, {"error": {"message": raw.decode(errors="replace")}}
    except (urllib.error.URLError, ConnectionError, TimeoutError) as exc:
        return 0, {"error": {"message": f"{type(exc).__name__}: {exc}"}}


def ask(url: str, model: str, shape: ReplayShape, agent: int, turn: int, timeout: float = 300.0) -> Reply:
    body = {
        "model": model,
        "messages": transcript(shape, agent, turn),
        "temperature": 0,
        "max_tokens": shape.max_tokens,
        "prompt_cache_key": f"agent-{agent}",
    }
    t0 = time.perf_counter()
    status, data = post_chat(url, body, {"x-smg-routing-key": f"agent-{agent}"}, timeout)
    reply = Reply(agent, turn, status, seconds=time.perf_counter() - t0)
    if status == 200:
        usage = data.get("usage") or {}
        reply.text = data["choices"][0]["message"].get("content") or ""
        reply.prompt_tokens = usage.get("prompt_tokens", 0)
        reply.cached_tokens = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    else:
        reply.error = json.dumps(data)[:500]
    return reply


def replay(
    url: str, model: str, shape: ReplayShape, *, timeout: float = 300.0, after_turn: Callable[[int], None] | None = None
) -> ReplayResult:
    """Run the replay against `url` (a worker or the router). `after_turn(t)` runs between
    turns (the kill test uses it)."""
    result = ReplayResult()
    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=shape.agents) as pool:
        for turn in range(shape.turns):
            futures = []
            for agent in ((turn + i) % shape.agents for i in range(shape.agents)):
                futures.append(pool.submit(ask, url, model, shape, agent, turn, timeout))
                time.sleep(0.02)  # arrival order = the rotated order
            result.replies += [f.result() for f in futures]
            if after_turn is not None:
                after_turn(turn)
    result.seconds = time.perf_counter() - t0
    return result


# --- the benchmark --------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--workers", default="1,2,3", help="fleet sizes to measure")
    parser.add_argument("--agents", type=int, default=12)
    parser.add_argument("--turns", type=int, default=6)
    parser.add_argument("--max-tokens", type=int, default=4)
    parser.add_argument("--port", type=int, default=31400, help="router port (workers follow)")
    parser.add_argument("--out", type=Path, default=Path("bench/results"))


def measure_fleet(model: str, workers: int, shape: ReplayShape, port: int) -> dict[str, Any]:
    """One fleet size: the replay through the router, then the same single request straight
    to a worker and through the router (the router's added latency)."""
    from agentkv.commands.cluster import Cluster, ClusterSpec

    spec = ClusterSpec(
        model=model,
        replicas=workers,
        router_port=port,
        worker_args=("--max-model-len", "2048", "--kv-cache-blocks", "1024"),
    )
    with Cluster(spec):
        result = replay(spec.router_url, model, shape)
        direct, routed = added_latency(spec.worker_urls[0], spec.router_url, model)
    completion = sum(1 for _ in result.ok) * shape.max_tokens
    prompt = sum(r.prompt_tokens for r in result.ok)
    return {
        "workers": workers,
        "requests": len(result.replies),
        "ok": len(result.ok),
        "seconds": result.seconds,
        "requests_per_s": len(result.ok) / result.seconds,
        "prompt_tokens_per_s": prompt / result.seconds,
        "requests_per_s_per_worker": len(result.ok) / result.seconds / workers,
        "completion_tokens": completion,
        "cached_ratio": result.cached_ratio,
        "direct_ms": direct * 1e3,
        "routed_ms": routed * 1e3,
        "router_added_ms": (routed - direct) * 1e3,
    }


def added_latency(worker_url: str, router_url: str, model: str, repeats: int = 9) -> tuple[float, float]:
    """Median seconds of one fully cached 1-token request, straight to a worker and through
    the router. With one worker both paths hit the same cache; the difference is the router."""
    import statistics

    body = {"model": model, "messages": [{"role": "user", "content": "ping"}], "max_tokens": 1, "temperature": 0}
    times: dict[str, list[float]] = {"direct": [], "routed": []}
    for _ in range(repeats):
        for name, url in (("direct", worker_url), ("routed", router_url)):
            t0 = time.perf_counter()
            status, _ = post_chat(url, body)
            if status == 200:
                times[name].append(time.perf_counter() - t0)
    return statistics.median(times["direct"]), statistics.median(times["routed"])


def run(args: argparse.Namespace) -> int:
    from agentkv.bench import common
    from agentkv.commands.cluster import router_available

    if not router_available():
        common.log("sglang-router is not installed (pip install 'agentkv[cluster]'): skipped")
        return 2
    shape = ReplayShape(agents=args.agents, turns=args.turns, max_tokens=args.max_tokens)
    rows = []
    for n in (int(x) for x in args.workers.split(",")):
        common.log(f"fleet of {n} worker(s): {shape.agents} agents x {shape.turns} turns")
        rows.append(measure_fleet(args.model, n, shape, args.port))
    payload = common.envelope("cluster", model=args.model, shape=vars_of(shape), fleets=rows)
    md = common.table(
        ("workers", "req/s", "req/s per worker", "prompt tok/s", "cached ratio", "router +ms"),
        [
            (
                r["workers"],
                common.fmt(r["requests_per_s"]),
                common.fmt(r["requests_per_s_per_worker"]),
                common.fmt(r["prompt_tokens_per_s"], ".0f"),
                common.fmt(r["cached_ratio"], ".3f"),
                common.fmt(r["router_added_ms"], ".1f"),
            )
            for r in rows
        ],
    )
    paths = common.write_outputs(args.out, "cluster", payload, md)
    groups = {
        f"{r['workers']} worker(s)": {"req/s": r["requests_per_s"], "req/s per worker": r["requests_per_s_per_worker"]}
        for r in rows
    }
    paths["png"] = common.bar_plot(
        args.out / "cluster.png", "agentkv behind sglang-router", groups, "requests per second"
    )
    common.print_paths(paths)
    return 0


def vars_of(shape: ReplayShape) -> dict[str, int]:
    return {k: getattr(shape, k) for k in shape.__dataclass_fields__}

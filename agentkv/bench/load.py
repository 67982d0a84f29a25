"""`agentkv bench load`: N concurrent streaming chat clients for a bounded time against a
local server (or --url). Its own server runs with the prefix cache off unless --prefix-cache,
so "every KV block is free afterwards" is an exact check. Passes (exit 0) when no request
failed, every stream was well-formed (role chunk first, JSON chunks, one finish_reason, usage,
[DONE]) and, for its own server, all KV blocks are free at the end. Reports throughput and
TTFT/ITL percentiles."""
from __future__ import annotations

import argparse
import asyncio
import json
import socket
import statistics
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from agentkv.bench.common import bar_plot, envelope, print_paths, table, write_outputs
from agentkv.bench.engine import add_engine_flags, build_engine


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--duration", type=float, default=30.0, metavar="S")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--url", default=None, help="an already running server (default: start one)")
    add_engine_flags(parser)
    parser.add_argument("--prefix-cache", action="store_true")
    parser.add_argument("--kv-cache-blocks", type=int, default=1024)
    parser.add_argument("--out", default="bench/out")


@dataclass
class Tally:
    ok: int = 0
    failed: int = 0
    malformed: int = 0
    tokens: int = 0
    ttft: list[float] = field(default_factory=list)
    itl: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def check_stream(events: list[str]) -> tuple[int, str | None]:
    """(completion tokens, problem or None) for one SSE stream's data payloads."""
    if not events or events[-1] != "[DONE]":
        return 0, "stream did not end with [DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    with_choices = [c for c in chunks if c["choices"]]
    if not with_choices or with_choices[0]["choices"][0]["delta"].get("role") != "assistant":
        return 0, "first chunk has no assistant role"
    reasons = [c["choices"][0]["finish_reason"] for c in with_choices if c["choices"][0]["finish_reason"]]
    if len(reasons) != 1 or with_choices[-1]["choices"][0]["finish_reason"] is None:
        return 0, f"finish reasons {reasons}"
    usage = chunks[-1].get("usage")
    if not usage:
        return 0, "no usage chunk"
    return usage["completion_tokens"], None


async def one_request(client, body: dict, tally: Tally) -> None:
    import httpx

    start = time.perf_counter()
    events, stamps = [], []
    try:
        async with client.stream("POST", "/v1/chat/completions", json=body) as r:
            if r.status_code != 200:
                tally.failed += 1
                tally.errors.append(f"{r.status_code}: {(await r.aread())[:200]!r}")
                return
            async for line in r.aiter_lines():
                if line.startswith("data: "):
                    events.append(line[6:])
                    stamps.append(time.perf_counter())
    except httpx.HTTPError as exc:
        tally.failed += 1
        tally.errors.append(repr(exc))
        return
    num_tokens, problem = check_stream(events)
    if problem:
        tally.malformed += 1
        tally.errors.append(problem)
        return
    tally.ok += 1
    tally.tokens += num_tokens
    content = [t for t, e in zip(stamps, events) if '"content":"' in e and '"content":""' not in e]
    if content:
        tally.ttft.append(content[0] - start)
        tally.itl.extend(b - a for a, b in zip(content, content[1:]))


async def client_loop(i: int, base: str, model: str, deadline: float, max_tokens: int,
                      tally: Tally) -> None:
    import httpx

    async with httpx.AsyncClient(base_url=base, timeout=300) as client:
        turn = 0
        while time.perf_counter() < deadline:
            body = {"model": model, "max_tokens": max_tokens, "temperature": 0.7, "seed": i * 1000 + turn,
                    "stream": True, "stream_options": {"include_usage": True},
                    "messages": [{"role": "system", "content": "You are a helpful agent."},
                                 {"role": "user", "content": f"Client {i}, turn {turn}: name a fruit."}]}
            await one_request(client, body, tally)
            turn += 1


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1] if len(values) > 1 else values[0]


def start_local(args: argparse.Namespace):
    """Our own server on a free port of 127.0.0.1: (base URL, AsyncEngine)."""
    import httpx
    import uvicorn

    from agentkv.runtime.async_engine import AsyncEngine
    from agentkv.server.app import create_app

    engine = AsyncEngine(build_engine(args, prefix_cache=args.prefix_cache,
                                      num_blocks=args.kv_cache_blocks, max_model_len=1024))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(create_app(engine, served_model_name=args.model),
                                           host="127.0.0.1", port=port, log_level="warning"))
    threading.Thread(target=server.run, daemon=True).start()
    base = f"http://127.0.0.1:{port}"
    while True:
        try:
            if httpx.get(f"{base}/health").status_code == 200:
                return base, engine
        except httpx.TransportError:
            time.sleep(0.1)


def figures(tally: Tally, elapsed: float, blocks: dict | None) -> dict:
    return {"requests_ok": tally.ok, "requests_failed": tally.failed, "streams_malformed": tally.malformed,
            "seconds": round(elapsed, 2), "requests_per_s": round(tally.ok / elapsed, 2),
            "tokens_per_s": round(tally.tokens / elapsed, 1),
            "ttft_ms": {f"p{q}": round(1000 * pct(tally.ttft, q), 1) for q in (50, 90, 99)},
            "itl_ms": {f"p{q}": round(1000 * pct(tally.itl, q), 1) for q in (50, 90, 99)},
            "kv_blocks_after": blocks, "errors": tally.errors[:10]}


def drive(args: argparse.Namespace, base: str) -> tuple[Tally, float]:
    """Every client in a loop until the deadline: (tally, seconds)."""
    tally = Tally()
    start = time.perf_counter()
    deadline = start + args.duration

    async def run_all() -> None:
        await asyncio.gather(*(client_loop(i, base, args.model, deadline, args.max_tokens, tally)
                               for i in range(args.clients)))

    asyncio.run(run_all())
    return tally, time.perf_counter() - start


def run(args: argparse.Namespace) -> int:
    if args.clients < 1 or args.duration <= 0:
        raise ValueError(f"--clients {args.clients} must be >= 1 and --duration {args.duration} > 0")
    engine, base = None, args.url
    if base is None:
        base, engine = start_local(args)
    tally, elapsed = drive(args, base)
    blocks = None
    if engine is not None:
        time.sleep(0.5)
        stats = engine.stats()
        blocks = {"used": stats.kv_blocks_used, "free": stats.kv_blocks_free, "running": stats.num_running}
    result = figures(tally, elapsed, blocks)
    leaked = blocks is not None and not args.prefix_cache and bool(blocks["used"] or blocks["running"])
    passed = not (tally.failed or tally.malformed or leaked or not tally.ok)
    payload = envelope("load", clients=args.clients, duration_s=args.duration, max_tokens=args.max_tokens,
                       url=args.url, model=args.model, prefix_cache=args.prefix_cache, passed=passed,
                       result=result)
    out = Path(args.out)
    md = table(["requests ok / failed / malformed", "req/s", "tok/s", "TTFT p50 / p90 / p99 ms",
                "ITL p50 / p90 / p99 ms", "KV blocks after (used / free)", "passed"],
               [[f"{tally.ok} / {tally.failed} / {tally.malformed}", result["requests_per_s"],
                 result["tokens_per_s"], " / ".join(map(str, result["ttft_ms"].values())),
                 " / ".join(map(str, result["itl_ms"].values())),
                 f"{blocks['used']} / {blocks['free']}" if blocks else "—", passed]])
    png = bar_plot(out / "load.png", f"{args.clients} streaming clients, {args.duration:g} s",
                   {"TTFT": result["ttft_ms"], "inter-token latency": result["itl_ms"]}, "ms")
    md.append(f"\n![load]({png.name})" if png else "")
    paths = write_outputs(out, "load", payload, md)
    print_paths({**paths, **({"png": png} if png else {})})
    print(json.dumps(result))
    return 0 if passed else 1

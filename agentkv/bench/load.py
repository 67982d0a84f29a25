"""`agentkv bench load`: does the server hold under load? Three phases against `agentkv serve`
in a child process (or, for the first two, an already running --url):

  load   N concurrent streaming chat clients at once (default 256; the server gets
         --max-queued-requests 32 where it has that flag, and any --serve-arg): every
         response must be a complete, well-formed SSE stream or a 429. Zero 5xx.
  storm  N clients again; a quarter leave while queued (after a random delay under half a
         second), a quarter leave after their first token. Afterwards the KV pool must be
         back to idle (no block held by a request; read from /metrics) within a second.
  kill   N/4 clients; the server gets SIGKILL once tokens flow, is restarted on the same
         port, and must serve a normal stream again.

Prints requests completed / rejected / failed, leaked blocks and TTFT p50/p99; writes
JSON, Markdown and a plot. Exits 0 only when every check passed."""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time
from pathlib import Path

from agentkv.bench.common import (
    bar_plot,
    envelope,
    log,
    print_paths,
    table,
    write_outputs,
)
from agentkv.bench.load_clients import Tally, pct, run_clients
from agentkv.bench.load_server import (
    QUEUE_FLAG,
    ServerProcess,
    pool_state,
    serve_has_flag,
    wait_idle,
)

IDLE_LIMIT_S = 1.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--clients", type=int, default=256)
    parser.add_argument("--turns", type=int, default=1, help="requests per client in the load phase")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--model", default="smollm2")
    parser.add_argument(
        "--max-queued-requests",
        type=int,
        default=32,
        help=f"passed to the server as {QUEUE_FLAG} where serve has that flag",
    )
    parser.add_argument("--max-model-len", type=int, default=512)
    parser.add_argument(
        "--serve-arg",
        action="append",
        default=[],
        metavar="FLAG",
        help="one more flag for `agentkv serve` (repeatable), e.g. --serve-arg=--max-num-seqs=32",
    )
    parser.add_argument("--url", default=None, help="an already running server: the load and storm phases only")
    parser.add_argument("--no-kill", action="store_true", help="skip the kill -9 phase")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="bench/out")


def server_flags(args: argparse.Namespace) -> tuple[list[str], bool]:
    """The flags our server starts with, and whether the admission-control flag is among them."""
    flags = ["--max-model-len", str(args.max_model_len)]
    has_queue = serve_has_flag(QUEUE_FLAG)
    if has_queue:
        flags += [QUEUE_FLAG, str(args.max_queued_requests)]
    return flags + list(args.serve_arg), has_queue


def storm_plan(clients: int, rng: random.Random) -> list[tuple[str | None, float]]:
    """Per client: (how it leaves, delay). A quarter 'queued', a quarter 'mid-stream'."""
    plan = []
    for i in range(clients):
        leave = {0: "queued", 1: "mid-stream"}.get(i % 4)
        plan.append((leave, rng.uniform(0.0, 0.5) if leave == "queued" else 0.0))
    return plan


def storm(base: str, args: argparse.Namespace, rng: random.Random) -> tuple[Tally, dict]:
    tally = asyncio.run(run_clients(base, args.model, args.max_tokens, storm_plan(args.clients, rng)))
    seconds, state = wait_idle(base, timeout_s=10 * IDLE_LIMIT_S)
    at_limit = state if seconds is not None else pool_state(base)
    return tally, {
        "idle_after_s": None if seconds is None else round(seconds, 3),
        "leaked_blocks": at_limit.held if seconds is None or seconds > IDLE_LIMIT_S else 0,
        "pool_after": at_limit._asdict(),
    }


async def _kill_when_flowing(server: ServerProcess, args: argparse.Namespace, tally_box: list) -> int:
    clients = max(2, args.clients // 4)
    # Long enough streams that the kill lands mid-stream even on a fast machine (and even when
    # the running state is seen late: 32-token streams at 18 ms a token once ended before it).
    max_tokens = max(args.max_tokens, min(64, args.max_model_len // 2))
    task = asyncio.ensure_future(run_clients(server.base, args.model, max_tokens, [(None, 0.0)] * clients, killed=True))
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < 60 and not task.done():
        if pool_state(server.base).running:
            break
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.1)
    code = await asyncio.to_thread(server.kill)
    tally_box.append(await task)
    return code


def kill_and_restart(server: ServerProcess, args: argparse.Namespace) -> dict:
    """SIGKILL mid-load, restart on the same port, one normal stream must succeed."""
    box: list[Tally] = []
    code = asyncio.run(_kill_when_flowing(server, args, box))
    restart_s = server.start()
    after = asyncio.run(run_clients(server.base, args.model, args.max_tokens, [(None, 0.0)]))
    return {
        "exit_code": code,
        "streams_cut": box[0].cut,
        "completed_before_kill": box[0].completed,
        "restart_s": round(restart_s, 2),
        "served_after_restart": after.completed == 1,
        "after_restart_errors": after.errors[:3],
    }


def figures(load: Tally, storm_tally: Tally, storm_pool: dict, killed: dict | None) -> dict:
    both = [load, storm_tally]
    return {
        "requests_completed": sum(t.completed for t in both),
        "requests_rejected_429": sum(t.rejected for t in both),
        "requests_failed": sum(t.failed for t in both),
        "responses_5xx": sum(t.server_errors for t in both),
        "streams_malformed": sum(t.malformed for t in both),
        "clients_left_on_purpose": storm_tally.left,
        "leaked_blocks": storm_pool["leaked_blocks"],
        "ttft_ms": {f"p{q}": round(1000 * pct(load.ttft, q), 1) for q in (50, 90, 99)},
        "itl_ms": {f"p{q}": round(1000 * pct(load.itl, q), 1) for q in (50, 90, 99)},
        "tokens_per_s": round(load.tokens / load.seconds, 1) if load.seconds else None,
        "load": load.summary(),
        "storm": {**storm_tally.summary(), **storm_pool},
        "kill": killed if killed is not None else "skipped",
        "errors": (load.errors + storm_tally.errors)[:10],
    }


def verdict(result: dict) -> bool:
    killed = result["kill"]
    return bool(
        result["requests_completed"]
        and not result["requests_failed"]
        and not result["responses_5xx"]
        and not result["streams_malformed"]
        and result["leaked_blocks"] == 0
        and result["storm"]["idle_after_s"] is not None
        and (killed == "skipped" or killed["served_after_restart"])
    )


def drive(args: argparse.Namespace) -> tuple[dict, dict]:
    """All phases: (result, facts about the server)."""
    rng = random.Random(args.seed)
    server, facts = None, {"url": args.url}
    if args.url is None:
        flags, has_queue = server_flags(args)
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        server = ServerProcess(args.model, flags, log_path=str(out / "load-server.log"))
        facts = {"serve_flags": flags, "admission_flag": has_queue, "load_s": round(server.start(), 1)}
    base = args.url or server.base
    try:
        log(f"load: {args.clients} clients x {args.turns} turns")
        load = asyncio.run(
            run_clients(base, args.model, args.max_tokens, [(None, 0.0)] * args.clients, turns=args.turns)
        )
        log(f"storm: {args.clients} clients, half of them leave")
        storm_tally, storm_pool = storm(base, args, rng)
        killed = None
        if server is not None and not args.no_kill:
            log("kill -9 mid-load, then restart")
            killed = kill_and_restart(server, args)
        return figures(load, storm_tally, storm_pool, killed), facts
    finally:
        if server is not None:
            server.stop()


def _summary_table(result: dict, passed: bool) -> list[str]:
    killed = result["kill"]
    return table(
        [
            "completed",
            "rejected (429)",
            "failed",
            "5xx",
            "malformed",
            "leaked blocks",
            "idle after storm s",
            "TTFT p50 / p99 ms",
            "restart after kill -9 s",
            "passed",
        ],
        [
            [
                result["requests_completed"],
                result["requests_rejected_429"],
                result["requests_failed"],
                result["responses_5xx"],
                result["streams_malformed"],
                result["leaked_blocks"],
                result["storm"]["idle_after_s"],
                f"{result['ttft_ms']['p50']} / {result['ttft_ms']['p99']}",
                killed if killed == "skipped" else killed["restart_s"],
                passed,
            ]
        ],
    )


def report(args: argparse.Namespace, result: dict, facts: dict, passed: bool) -> None:
    payload = envelope(
        "load",
        clients=args.clients,
        turns=args.turns,
        max_tokens=args.max_tokens,
        max_queued_requests=args.max_queued_requests,
        model=args.model,
        server=facts,
        passed=passed,
        result=result,
    )
    out = Path(args.out)
    md = _summary_table(result, passed)
    counts = {k: result[f"requests_{k}"] for k in ("completed", "rejected_429", "failed")}
    png = bar_plot(
        out / "load.png",
        f"{args.clients} streaming clients, max_tokens {args.max_tokens}",
        {
            "requests (load + storm)": {**counts, "left on purpose": result["clients_left_on_purpose"]},
            "TTFT (load phase)": result["ttft_ms"],
            "inter-token latency": result["itl_ms"],
        },
        "count / ms",
    )
    md.append(f"\n![load]({png.name})" if png else "")
    paths = write_outputs(out, "load", payload, md)
    print_paths({**paths, **({"png": png} if png else {})})
    print(
        f"requests completed {result['requests_completed']}, rejected {result['requests_rejected_429']}, "
        f"failed {result['requests_failed']}, leaked blocks {result['leaked_blocks']}, "
        f"TTFT p50 {result['ttft_ms']['p50']} ms p99 {result['ttft_ms']['p99']} ms"
    )
    print(json.dumps({k: v for k, v in result.items() if k != "errors"}))


def run(args: argparse.Namespace) -> int:
    if args.clients < 1 or args.turns < 1 or args.max_tokens < 1:
        raise ValueError(
            f"--clients {args.clients}, --turns {args.turns} and --max-tokens {args.max_tokens} must be >= 1"
        )
    result, facts = drive(args)
    passed = verdict(result)
    report(args, result, facts, passed)
    return 0 if passed else 1

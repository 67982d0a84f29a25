"""The streaming clients of `agentkv bench load`: one chat stream per client and turn, each
response judged as a complete well-formed SSE stream, a 429 in OpenAI's rate-limit shape,
a client that left on purpose, or a failure."""

from __future__ import annotations

import asyncio
import itertools
import json
import statistics
import time
from dataclasses import dataclass, field

# (how the client leaves: None | "queued" | "mid-stream", seconds before a "queued" one leaves)
Plan = tuple[str | None, float]


@dataclass
class Tally:
    completed: int = 0
    rejected: int = 0  # 429
    rejected_without_retry_after: int = 0
    failed: int = 0  # any other status, or the connection broke (5xx are also counted below)
    server_errors: int = 0
    malformed: int = 0
    left: int = 0  # clients that hung up on purpose
    cut: int = 0  # connections the server's kill broke (kill phase only)
    tokens: int = 0
    seconds: float = 0.0
    ttft: list[float] = field(default_factory=list)
    itl: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def summary(self) -> dict:
        keys = (
            "completed",
            "rejected",
            "rejected_without_retry_after",
            "failed",
            "server_errors",
            "malformed",
            "left",
            "cut",
            "tokens",
        )
        return {**{k: getattr(self, k) for k in keys}, "seconds": round(self.seconds, 2)}


def check_stream(events: list[str]) -> tuple[int, str | None]:
    """(completion tokens, problem or None) for one SSE stream's data payloads."""
    if not events or events[-1] != "[DONE]":
        return 0, "stream did not end with [DONE]"
    try:
        chunks = [json.loads(e) for e in events[:-1]]
    except json.JSONDecodeError as exc:
        return 0, f"a data line is not JSON: {exc}"
    if any("error" in c for c in chunks):
        return 0, f"error event: {next(c for c in chunks if 'error' in c)}"
    with_choices = [c for c in chunks if c.get("choices")]
    if not with_choices or with_choices[0]["choices"][0]["delta"].get("role") != "assistant":
        return 0, "first chunk has no assistant role"
    reasons = [c["choices"][0]["finish_reason"] for c in with_choices if c["choices"][0]["finish_reason"]]
    if len(reasons) != 1 or with_choices[-1]["choices"][0]["finish_reason"] is None:
        return 0, f"finish reasons {reasons}"
    usage = chunks[-1].get("usage")
    if not usage:
        return 0, "no usage chunk"
    return usage["completion_tokens"], None


def _rejection(tally: Tally, headers, body: bytes) -> None:
    """A 429 counts as a rejection when its body is OpenAI's rate_limit_error shape."""
    try:
        kind = json.loads(body)["error"]["type"]
    except (ValueError, KeyError, TypeError):
        kind = None
    if kind != "rate_limit_error":
        tally.malformed += 1
        tally.errors.append(f"429 not in rate_limit_error shape: {body[:200]!r}")
        return
    tally.rejected += 1
    if "retry-after" not in headers:
        tally.rejected_without_retry_after += 1


def _is_content(event: str) -> bool:
    return '"content":"' in event and '"content":""' not in event


async def _stream(client, body: dict, tally: Tally, leave: str | None) -> tuple[list, list] | None:
    """The stream's (events, stamps), or None when it was judged already (status, left)."""
    events, stamps = [], []
    async with client.stream("POST", "/v1/chat/completions", json=body) as r:
        if r.status_code != 200:
            data = await r.aread()
            if r.status_code == 429:
                _rejection(tally, r.headers, data)
                return None
            tally.failed += 1
            tally.server_errors += r.status_code >= 500
            tally.errors.append(f"{r.status_code}: {data[:200]!r}")
            return None
        async for line in r.aiter_lines():
            if line.startswith("data: "):
                events.append(line[6:])
                stamps.append(time.perf_counter())
                if leave == "mid-stream" and _is_content(line):
                    tally.left += 1
                    return None
    return events, stamps


async def one_request(client, body: dict, tally: Tally, plan: Plan, killed: bool = False) -> None:
    import httpx

    leave, delay = plan
    start = time.perf_counter()
    try:
        if leave == "queued":
            try:
                got = await asyncio.wait_for(_stream(client, body, tally, None), timeout=delay)
            except TimeoutError:
                tally.left += 1
                return
        else:
            got = await _stream(client, body, tally, leave)
    except httpx.HTTPError as exc:
        if killed:
            tally.cut += 1
            return
        tally.failed += 1
        tally.errors.append(repr(exc))
        return
    if got is not None:
        _judge(tally, *got, start)


def _judge(tally: Tally, events: list[str], stamps: list[float], start: float) -> None:
    num_tokens, problem = check_stream(events)
    if problem:
        tally.malformed += 1
        tally.errors.append(problem)
        return
    tally.completed += 1
    tally.tokens += num_tokens
    content = [t for t, e in zip(stamps, events) if _is_content(e)]
    if content:
        tally.ttft.append(content[0] - start)
        tally.itl.extend(b - a for a, b in itertools.pairwise(content))


def chat_body(model: str, max_tokens: int, i: int, turn: int) -> dict:
    return {
        "model": model,
        "max_tokens": max_tokens,
        "temperature": 0.7,
        "seed": i * 1000 + turn,
        "stream": True,
        "stream_options": {"include_usage": True},
        "messages": [
            {"role": "system", "content": "You are a helpful agent."},
            {"role": "user", "content": f"Client {i}, turn {turn}: name a fruit."},
        ],
    }


HEAD_START_S = 0.1  # a storm's leaving clients arrive this much earlier than the others


async def run_clients(
    base: str, model: str, max_tokens: int, plans: list[Plan], *, turns: int = 1, killed: bool = False
) -> Tally:
    """One client per plan, all at once, each `turns` requests back to back: the tally."""
    import httpx

    tally = Tally()

    leavers = any(leave is not None for leave, _ in plans)

    async def client_loop(i: int, plan: Plan) -> None:
        if leavers and plan[0] is None:
            await asyncio.sleep(HEAD_START_S)  # the clients that will leave are admitted first
        async with httpx.AsyncClient(base_url=base, timeout=600) as client:
            for turn in range(turns):
                await one_request(client, chat_body(model, max_tokens, i, turn), tally, plan, killed)

    start = time.perf_counter()
    await asyncio.gather(*(client_loop(i, plan) for i, plan in enumerate(plans)))
    tally.seconds = time.perf_counter() - start
    return tally


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1]

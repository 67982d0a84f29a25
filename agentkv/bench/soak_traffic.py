"""The mixed traffic of `agentkv bench soak`: what agents and bad clients send a server over a
long run, each kind a function of (server base URL, API key, rng) that returns the HTTP status
it got (or raises for a broken connection). Greedy chat turns are kept as samples to replay
on a cold server."""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import httpx

SYSTEMS = [
    "You are a careful assistant for a logistics team. Answer briefly." * 6,
    "You are a coding agent. Use the tools when they help; keep answers short." * 6,
]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "search_docs",
            "description": "Search the documentation",
            "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]},
        },
    }
]
TOPICS = ["invoices", "shipping delays", "a failing unit test", "the weather", "a CSV export", "rate limits"]


class Sample(NamedTuple):
    """A greedy chat turn and the text the soaked server answered."""

    key: str
    messages: list[dict[str, Any]]
    text: str


def _messages(rng: random.Random) -> list[dict[str, Any]]:
    turns = [{"role": "system", "content": rng.choice(SYSTEMS)}]
    for i in range(rng.randrange(1, 4)):
        turns.append({"role": "user", "content": f"Turn {i}: tell me about {rng.choice(TOPICS)}."})
        if i < 2:
            turns.append({"role": "assistant", "content": f"Noted: {rng.choice(TOPICS)}."})
    if turns[-1]["role"] != "user":
        turns.append({"role": "user", "content": "And then?"})
    return turns


def _headers(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def chat(base: str, key: str, rng: random.Random, samples: list[Sample]) -> int:
    body = {"model": "soak", "messages": _messages(rng), "max_tokens": 16, "temperature": 0}
    r = httpx.post(f"{base}/v1/chat/completions", json=body, headers=_headers(key), timeout=120)
    if r.status_code == 200 and len(samples) < 64:
        samples.append(Sample(key, body["messages"], r.json()["choices"][0]["message"]["content"] or ""))
    return r.status_code


def _stream(base: str, key: str, body: dict, on_line: Callable[[int], bool]) -> int:
    """POST a streaming chat; `on_line(i)` is called per SSE line and returns False to leave."""
    with httpx.stream("POST", f"{base}/v1/chat/completions", json=body, headers=_headers(key), timeout=120) as r:
        for i, _ in enumerate(r.iter_lines()):
            if not on_line(i):
                break
        return r.status_code


def stream(base: str, key: str, rng: random.Random, samples: list[Sample]) -> int:
    body = {"model": "soak", "messages": _messages(rng), "max_tokens": 32, "stream": True}
    return _stream(base, key, body, lambda i: True)


def abort(base: str, key: str, rng: random.Random, samples: list[Sample]) -> int:
    body = {"model": "soak", "messages": _messages(rng), "max_tokens": 200, "stream": True}
    return _stream(base, key, body, lambda i: i < rng.randrange(1, 6))


def slow_reader(base: str, key: str, rng: random.Random, samples: list[Sample]) -> int:
    body = {"model": "soak", "messages": _messages(rng), "max_tokens": 48, "stream": True}
    return _stream(base, key, body, lambda i: time.sleep(0.25) is None)


def tools(base: str, key: str, rng: random.Random, samples: list[Sample]) -> int:
    body = {
        "model": "soak",
        "messages": _messages(rng),
        "tools": TOOLS,
        "tool_choice": rng.choice(["auto", "required"]),
        "max_tokens": 48,
    }
    return httpx.post(f"{base}/v1/chat/completions", json=body, headers=_headers(key), timeout=120).status_code


def anthropic_pins(base: str, key: str, rng: random.Random, samples: list[Sample]) -> int:
    mark = {"type": "ephemeral", "ttl": rng.choice(["5m", "1h"])}
    body = {
        "model": "soak",
        "max_tokens": 16,
        "system": [{"type": "text", "text": rng.choice(SYSTEMS), "cache_control": mark}],
        "messages": [
            {
                "role": "user",
                "content": [{"type": "text", "text": f"About {rng.choice(TOPICS)}", "cache_control": mark}],
            }
        ],
    }
    return httpx.post(f"{base}/v1/messages", json=body, headers={"x-api-key": key}, timeout=120).status_code


def bad_body(base: str, key: str, rng: random.Random, samples: list[Sample]) -> int:
    bodies = [
        b"{not json",
        json.dumps({"model": "soak", "messages": "not a list"}).encode(),
        json.dumps({"model": "soak", "messages": [{"role": "user", "content": "x"}], "max_tokens": -3}).encode(),
        json.dumps({"model": "soak", "prompt": "x", "stop": ["s"] * 500}).encode(),
    ]
    path = "/v1/completions" if rng.random() < 0.3 else "/v1/chat/completions"
    headers = {**_headers(key), "content-type": "application/json"}
    return httpx.post(f"{base}{path}", content=rng.choice(bodies), headers=headers, timeout=60).status_code


KINDS: dict[str, tuple[Callable[..., int], float]] = {  # name -> (action, weight)
    "chat": (chat, 4),
    "stream": (stream, 3),
    "tools": (tools, 2),
    "anthropic_pins": (anthropic_pins, 2),
    "abort": (abort, 1),
    "slow_reader": (slow_reader, 1),
    "bad_body": (bad_body, 1),
}

"""The one HTTP client `agentkv bench long` sends to both servers: streamed /v1/completions
with text prompts (llama_cpp.server takes no token-id prompts), greedy, a fixed answer
length, every data line stamped on arrival; and the four figures measured with it.

Both servers get the same request body. Each ignores the fields it does not know:

    ignore_eos   agentkv's way to decode exactly max_tokens
    min_tokens   llama_cpp.server's way (its MinTokensLogitsProcessor masks EOS until then)
    repeat_penalty 1.0  llama_cpp.server applies 1.1 by default; 1.0 keeps both plain greedy
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from typing import Any, NamedTuple

TIMEOUT_S = 3600.0


class Stream(NamedTuple):
    """One streamed completion. `stamps`: perf_counter seconds of each chunk that carries a
    token (one per token on both servers); `num_tokens`: the usage count when the server
    reports one (agentkv), else the token chunks (llama_cpp.server has no stream usage)."""

    t_submit: float
    stamps: list[float]
    t_done: float  # the chunk with the finish reason
    text: str
    num_tokens: int
    finish_reason: str
    prompt_tokens: int | None
    cached_tokens: int | None

    @property
    def ttft_s(self) -> float:
        return (self.stamps[0] if self.stamps else self.t_done) - self.t_submit

    @property
    def decode_tok_s(self) -> float | None:
        """Tokens after the first over the time from the first token to the finish."""
        if self.num_tokens < 2 or not self.stamps:
            return None
        return (self.num_tokens - 1) / max(self.t_done - self.stamps[0], 1e-9)


def body(model: str, prompt: str, max_tokens: int) -> dict[str, Any]:
    return {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "ignore_eos": True,
        "min_tokens": max_tokens,
        "repeat_penalty": 1.0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


async def complete(client, request: dict[str, Any]) -> Stream:
    """POST one streamed completion and read it to the end. Raises RuntimeError naming the
    status, or a stream that ended without a finish reason (a cut-off stream)."""
    t_submit = time.perf_counter()
    stamps, text, finish, t_done, usage = [], [], None, None, {}
    async with client.stream("POST", "/v1/completions", json=request) as resp:
        if resp.status_code != 200:
            raise RuntimeError(f"POST /v1/completions answered {resp.status_code}: {(await resp.aread())[:300]!r}")
        async for line in resp.aiter_lines():
            if not line.startswith("data:") or line[5:].strip() == "[DONE]":
                continue
            chunk = json.loads(line[5:])
            usage = chunk.get("usage") or usage
            for choice in chunk.get("choices") or []:
                if choice.get("finish_reason"):
                    finish, t_done = choice["finish_reason"], time.perf_counter()
                else:
                    stamps.append(time.perf_counter())
                text.append(choice.get("text") or "")
    if finish is None:
        raise RuntimeError(f"a stream ended without a finish reason after {len(stamps)} tokens")
    return Stream(
        t_submit,
        stamps,
        t_done,
        "".join(text),
        usage.get("completion_tokens", len(stamps)),
        finish,
        usage.get("prompt_tokens"),
        (usage.get("prompt_tokens_details") or {}).get("cached_tokens"),
    )


def client(base: str):
    """A fresh connection per request (no keep-alive): llama-server closes a connection after
    a streamed answer, and a request sent on it at that moment fails with no response."""
    import httpx

    limits = httpx.Limits(max_connections=256, max_keepalive_connections=0)
    return httpx.AsyncClient(base_url=base, timeout=TIMEOUT_S, limits=limits)


async def replay(base: str, model: str, segments: list[list[str]], answer_len: int) -> dict[str, Any]:
    """The tool loop: turn-major, every agent's request of a turn sent at once; each agent's
    context grows by its segment, then by the answer text its server returned. Wall time
    of all turns; per-turn seconds, tokens and, where the server says, cached prompt tokens."""
    contexts = ["" for _ in segments[0]]
    turn_s, streams = [], []
    async with client(base) as http:
        t0 = time.perf_counter()
        for row in segments:
            contexts = [c + s for c, s in zip(contexts, row)]
            t_turn = time.perf_counter()
            got = await asyncio.gather(*(complete(http, body(model, c, answer_len)) for c in contexts))
            turn_s.append(time.perf_counter() - t_turn)
            contexts = [c + g.text for c, g in zip(contexts, got)]
            streams += got
        wall = time.perf_counter() - t0
    return {"wall_s": wall, "turn_s": turn_s, **summary(streams, answer_len)}


async def fleet(base: str, model: str, segments: list[list[str]], answer_len: int) -> dict[str, Any]:
    """The tool loop with no turn barrier: every agent at once, each sending its own turns
    in order (its context grows by its segment, then by its answer). Wall time until the last
    agent is done, and each agent's own."""

    async def agent(http, a: int, t0: float) -> tuple[float, list[Stream]]:
        context, got = "", []
        for row in segments:
            context += row[a]
            got.append(await complete(http, body(model, context, answer_len)))
            context += got[-1].text
        return time.perf_counter() - t0, got

    async with client(base) as http:
        t0 = time.perf_counter()
        agents = await asyncio.gather(*(agent(http, a, t0) for a in range(len(segments[0]))))
        wall = time.perf_counter() - t0
    streams = [s for _, got in agents for s in got]
    return {"wall_s": wall, "agent_s": [s for s, _ in agents], **summary(streams, answer_len)}


def summary(streams: list[Stream], answer_len: int) -> dict[str, Any]:
    """What the replay and the fleet report besides their times."""
    cached = [s.cached_tokens for s in streams]
    return {
        "requests": len(streams),
        "completion_tokens": sum(s.num_tokens for s in streams),
        "short_answers": sum(s.num_tokens < answer_len for s in streams),
        "ttft_median_s": statistics.median(s.ttft_s for s in streams),
        "prompt_tokens": sum(s.prompt_tokens or 0 for s in streams) if streams[0].prompt_tokens else None,
        "cached_tokens": sum(cached) if None not in cached else None,
    }


async def ttft(base: str, model: str, prompt: str, depth_len: int) -> dict[str, Any]:
    """Seconds to the first token of `prompt` (the caller makes it unique), the prefill
    tokens/s that makes, and the decode tokens/s of the `depth_len` tokens asked at that
    depth. Its length in the server's tokens: from the usage, else (llama_cpp.server, whose
    stream has none) from its /extras/tokenize/count, asked after the timed request."""
    async with client(base) as http:
        s = await complete(http, body(model, prompt, depth_len))
        prompt_tokens = s.prompt_tokens
        if prompt_tokens is None:
            resp = await http.post("/extras/tokenize/count", json={"input": prompt})
            prompt_tokens = resp.json().get("count") if resp.status_code == 200 else None
    return {
        "ttft_s": s.ttft_s,
        "prefill_tok_s": prompt_tokens / s.ttft_s if prompt_tokens else None,
        "decode_at_depth_tok_s": s.decode_tok_s,
        "prompt_tokens": prompt_tokens,
        "cached_tokens": s.cached_tokens,
    }


async def decode(base: str, model: str, prompt: str, decode_len: int, repeats: int = 3) -> dict[str, Any]:
    """Single-stream decode tokens/s after a short prompt (first token to finish): the median
    of `repeats` streams one after another, so one slow moment of a shared VM does not make
    the figure (every arm runs the same repeats); each stream's figure is kept."""
    async with client(base) as http:
        runs = [await complete(http, body(model, prompt, decode_len)) for _ in range(repeats)]
    rates = [s.decode_tok_s for s in runs]
    return {
        "decode_tok_s": statistics.median(r for r in rates if r is not None) if any(rates) else None,
        "runs_tok_s": rates,
        "tokens": runs[-1].num_tokens,
        "finish_reason": runs[-1].finish_reason,
    }


def max_overlap(streams: list[Stream]) -> int:
    """The most streams decoding at one moment (first token .. finish): 1 = serialised."""
    events = sorted([(s.stamps[0], 1) for s in streams if s.stamps] + [(s.t_done, -1) for s in streams if s.stamps])
    now = best = 0
    for _, step in events:
        now += step
        best = max(best, now)
    return best


async def streams(base: str, model: str, prompts: list[str], decode_len: int) -> dict[str, Any]:
    """len(prompts) streams at once: aggregate tokens/s = tokens after each stream's first /
    (last finish - first first token), and how many were ever decoding together."""
    async with client(base) as http:
        got = await asyncio.gather(*(complete(http, body(model, p, decode_len)) for p in prompts))
    firsts = [s.stamps[0] for s in got if s.stamps]
    span = max(s.t_done for s in got) - min(firsts)
    tokens = sum(max(s.num_tokens - 1, 0) for s in got)
    return {
        "streams": len(got),
        "aggregate_tok_s": tokens / max(span, 1e-9),
        "tokens": sum(s.num_tokens for s in got),
        "max_concurrent": max_overlap(got),
        "ttft_max_s": max(s.ttft_s for s in got),
    }

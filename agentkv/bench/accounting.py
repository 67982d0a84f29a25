"""The reuse accounting agent workloads are judged by: fak radixbench's longest-common-prefix
count, what agentkv's radix cache must hit, and the session-workload formulas of docs/design.md."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any


def _lcp(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def radixbench_reuse(prompts: list[list[list[int]]]) -> dict[str, Any]:
    """fak radixbench's accounting: each request, in order, reuses its longest common prefix
    with anything sent before (no cap). Returns total, reused, hit rate and token ceiling."""
    sent: list[list[int]] = []
    total = reused = 0
    for turn in prompts:
        for p in turn:
            reused += max((_lcp(p, s) for s in sent), default=0)
            total += len(p)
            sent.append(p)
    return {
        "total_tokens": total,
        "reused_tokens": reused,
        "computed_tokens": total - reused,
        "hit_rate": reused / total if total else 0.0,
        "token_ceiling": total / (total - reused) if total > reused else float("inf"),
    }


def agentkv_expected_hits(
    prompts: list[list[list[int]]], answers: Callable[[int, int], Sequence[int]] | None = None
) -> list[list[int]]:
    """What agentkv's radix cache must hit per request, [turn][agent], for turn-major batched
    submission: a request matches (a) what earlier turns left in the cache — each finished
    request's prompt + answer minus its last token (whose KV is never computed) — and (b)
    the prompts of the same turn submitted before it (in-flight prefixes are waited for, not
    recomputed), capped at len(prompt) - 1 because the last prompt token must be computed
    for its logits. Assumes nothing is evicted (the KV pool holds the whole run)."""
    cached: list[Sequence[int]] = []
    out = []
    for t, turn in enumerate(prompts):
        hits = []
        for a, p in enumerate(turn):
            best = max((_lcp(p, c) for c in cached + turn[:a]), default=0)
            hits.append(min(best, len(p) - 1))
        out.append(hits)
        for a, p in enumerate(turn):
            ans = list(answers(t, a)) if answers is not None else [0]
            cached.append(list(p) + ans[:-1])
    return out


def session_formulas(P: int, T: int, C: int, D: int, R: int, U: int = 0) -> dict[str, int]:
    """docs/design.md's session-workload prefill counts (C agents, T turns, shared prefix P, answer
    D, tool result R), with U per-agent tokens after the prefix at turn 0 (DESIGN has U = 0):
    naive = C·Σ_{t<T}(P + U + t(D+R)); warm per-agent cache = C(P + U + (T−1)R);
    shared prefix + per-agent reuse = P + C·U + C(T−1)R."""
    return {
        "naive": C * sum(P + U + t * (D + R) for t in range(T)),
        "warm_per_agent": C * (P + U + (T - 1) * R),
        "shared_prefix": P + C * U + C * (T - 1) * R,
    }


def agentkv_session_prefill(P: int, T: int, C: int, D: int, R: int, U: int = 0) -> int:
    """agentkv's exact prefill count for the session shape: the shared-prefix formula plus
    one token per agent per later turn (the previous answer's last token, never computed
    during decode) and, when U = 0, one token per extra agent at turn 0 (identical prompts:
    the last token is always computed)."""
    first = P + C * U if U > 0 else P + (C - 1)
    return first + C * (T - 1) * (R + (1 if D > 0 else 0))

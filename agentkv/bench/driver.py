"""One arm on one agent workload, inside its own process: load the arm, warm it up, drive the
workload turn-major and return per-request records and the arm's figures as JSON.

Run through `agentkv.bench.isolate` with target `agentkv.bench.driver:worker`.
"""

from __future__ import annotations

import cProfile
import io
import math
import pstats
import resource
import time

from agentkv.bench import workloads as wl
from agentkv.bench.arms import Arm, make_arm


def load_workload(spec: dict) -> wl.Workload:
    tokenizer = None
    if spec["workload"] == "tool-loop":
        from agentkv.formats.resolve import open_model
        from agentkv.formats.tokenizer import load_tokenizer

        tokenizer = load_tokenizer(open_model(spec["model"]))
    return wl.build(spec["workload"], tokenizer, spec.get("quick", False), **spec.get("overrides", {}))


def kv_budget(workload: wl.Workload, block_size: int = 16) -> tuple[int, int]:
    """(KV blocks that hold the whole run without eviction, longest context + slack)."""
    lens = [0] * workload.num_agents
    for turn in workload.segments:
        for a, seg in enumerate(turn):
            lens[a] += len(seg) + (workload.max_tokens if workload.keep_answers else 0)
    total = sum(lens) + workload.num_agents * (workload.max_tokens + block_size)
    return total // block_size + 64, max(lens) + workload.max_tokens + 64


def drive(arm: Arm, workload: wl.Workload, reference: list[list[list[int]]] | None) -> dict:
    """Run `workload` turn-major on `arm`. Kept answers are the arm's own, or `reference`'s
    [turn][agent] token ids when given (so every arm is fed the same prompts)."""
    transcript = wl.Transcript(workload)
    records, turn_s = [], []
    t_start = time.perf_counter()
    for t in range(workload.num_turns):
        prompts = transcript.prompts(t)
        t0 = time.perf_counter()
        results = arm.run_turn(prompts, workload.max_tokens)
        turn_s.append(time.perf_counter() - t0)
        answers = reference[t] if reference is not None else [r.token_ids for r in results]
        transcript.record(answers)
        records += [dict(turn=t, agent=a, **r._asdict()) for a, r in enumerate(results)]
    wall = time.perf_counter() - t_start
    return {"wall_s": wall, "turn_s": turn_s, "records": records}


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))]


def metrics(run: dict) -> dict:
    """Figures of one arm's run from its per-request records."""
    recs = run["records"]
    prompt = sum(r["prompt_len"] for r in recs)
    known = all(r["cached_len"] is not None for r in recs)
    hit = sum(r["cached_len"] or 0 for r in recs) if known else None
    ttft = [r["t_first"] - r["t_submit"] for r in recs]
    gen = [r["num_generated"] for r in recs]
    dec_tokens = sum(max(g - 1, 0) for g in gen)
    dec_time = sum(r["t_done"] - r["t_first"] for r in recs)
    cum, total = [], 0
    for t in range(len(run["turn_s"])):
        total += sum(r["prompt_len"] - (r["cached_len"] or 0) for r in recs if r["turn"] == t)
        cum.append(total)
    return {
        "wall_s": run["wall_s"],
        "turn_s": run["turn_s"],
        "requests": len(recs),
        "prompt_tokens": prompt,
        "prefix_hit_tokens": hit,
        "prefill_computed": prompt - hit if known else None,
        "cum_prefill": cum,
        "hit_rate": hit / prompt if known and prompt else None,
        "ttft_p50_s": _pct(ttft, 0.5),
        "ttft_p95_s": _pct(ttft, 0.95),
        "decode_tok_s": dec_tokens / dec_time if dec_tokens and dec_time > 0 else None,
        "throughput_tok_s": sum(gen) / run["wall_s"] if run["wall_s"] else None,
    }


def _profile_top(prof: cProfile.Profile, n: int = 25) -> list[str]:
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("cumulative").print_stats(n)
    return [line for line in buf.getvalue().splitlines() if line.strip()][-n - 1 :]


def worker(spec: dict) -> dict:
    """Load one arm, warm it up, drive the workload; everything the parent needs as JSON."""
    workload = load_workload(spec)
    blocks, n_ctx = kv_budget(workload)
    t0 = time.perf_counter()
    arm = make_arm(spec["arm"], spec["model"], blocks, n_ctx, spec.get("weights", "resident"))
    load_s = time.perf_counter() - t0
    try:
        arm.warm_up(wl.lcg(24, 4242, 1000))
        prof = cProfile.Profile() if spec.get("profile") else None
        if prof:
            prof.enable()
        run = drive(arm, workload, spec.get("reference"))
        if prof:
            prof.disable()
        counters = arm.counters()
    finally:
        arm.close()
    out = {
        "arm": arm.name,
        "notes": arm.notes,
        "batched": arm.batched,
        "load_s": load_s,
        **metrics(run),
        "counters": counters,
        "records": run["records"],
    }
    rss_self = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    rss_child = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    out["peak_rss_mib"] = max(rss_self, rss_child) if spec["arm"] == "agentkv-http" else rss_self
    out["client_rss_mib"] = rss_self
    if prof:
        out["profile"] = _profile_top(prof)
    return out

"""Run agent workloads on arms: the turn-major driver, per-arm metrics, one subprocess per
arm (so peak RSS is the arm's own), the exactness check and the acceptance targets.

Worker entry (used by `run_suite`):  python -m agentkv.bench.agents SPEC.json OUT.json
"""
from __future__ import annotations

import cProfile
import io
import json
import math
import os
import pstats
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from agentkv.bench import workloads as wl
from agentkv.bench.arms import Arm, make_arm

REFERENCE = "agentkv"  # the arm whose answers the replaying arms append


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
    return {"wall_s": run["wall_s"], "turn_s": run["turn_s"], "requests": len(recs),
            "prompt_tokens": prompt, "prefix_hit_tokens": hit,
            "prefill_computed": prompt - hit if known else None, "cum_prefill": cum,
            "hit_rate": hit / prompt if known and prompt else None,
            "ttft_p50_s": _pct(ttft, 0.5), "ttft_p95_s": _pct(ttft, 0.95),
            "decode_tok_s": dec_tokens / dec_time if dec_tokens and dec_time > 0 else None,
            "throughput_tok_s": sum(gen) / run["wall_s"] if run["wall_s"] else None}


def _profile_top(prof: cProfile.Profile, n: int = 25) -> list[str]:
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("cumulative").print_stats(n)
    return [line for line in buf.getvalue().splitlines() if line.strip()][-n - 1:]


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
    out = {"arm": arm.name, "notes": arm.notes, "batched": arm.batched, "load_s": load_s,
           **metrics(run), "counters": counters, "records": run["records"]}
    rss_self = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    rss_child = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    out["peak_rss_mib"] = max(rss_self, rss_child) if spec["arm"] == "agentkv-http" else rss_self
    out["client_rss_mib"] = rss_self
    if prof:
        out["profile"] = _profile_top(prof)
    return out


def run_arm_subprocess(spec: dict, workdir: Path, timeout_s: float | None = None,
                       reuse: bool = False) -> dict:
    """Run `worker(spec)` in a fresh interpreter; a failure becomes {"error": ...}. With
    `reuse`, a finished result of the identical spec in `workdir` is returned instead."""
    workdir.mkdir(parents=True, exist_ok=True)
    tag = f"{spec['workload']}-{spec['arm']}{'-profile' if spec.get('profile') else ''}"
    spec_path, out_path = workdir / f"{tag}.spec.json", workdir / f"{tag}.result.json"
    if reuse and spec_path.exists() and out_path.exists() and \
            json.loads(spec_path.read_text()) == json.loads(json.dumps(spec)):
        return {**json.loads(out_path.read_text()), "reused_result": str(out_path)}
    spec_path.write_text(json.dumps(spec))
    out_path.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "agentkv.bench.agents", str(spec_path), str(out_path)]
    # Own session, so a timeout also ends what the arm started (the HTTP arm's server).
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return {"arm": spec["arm"], "error": f"timed out after {timeout_s:.0f} s"}
    if proc.returncode != 0 or not out_path.exists():
        tail = (stderr or stdout)[-2000:]
        return {"arm": spec["arm"], "error": f"exit {proc.returncode}: {tail}"}
    return json.loads(out_path.read_text())


# The expensive arms (they recompute every prompt) go last; each arm's result is kept in
# OUT/runs/ as soon as it finishes.
ORDER = ("agentkv", "agentkv-http", "llamacpp", "agentkv-nocache", "transformers")
LIVE = ("agentkv", "agentkv-nocache")  # append their own answers; the rest replay agentkv's


def _answers(result: dict, workload: wl.Workload) -> list[list[list[int]]]:
    grid = [[[] for _ in range(workload.num_agents)] for _ in range(workload.num_turns)]
    for r in result["records"]:
        grid[r["turn"]][r["agent"]] = r["token_ids"]
    return grid


def run_workload(name: str, arms: list[str], model: str, out_dir: Path, quick: bool = False,
                 overrides: dict | None = None, profile_on_miss: bool = True,
                 log=print, weights: str = "resident", arm_timeout_s: float | None = None,
                 reuse: bool = False) -> dict:
    """Every arm on workload `name` (one subprocess each), then accounting, exactness and
    targets. The agentkv arm runs first: its answers are the transcript the others replay."""
    spec0 = {"workload": name, "model": model, "quick": quick, "overrides": overrides or {},
             "weights": weights}
    workload = load_workload(spec0)
    results: dict[str, dict] = {}
    reference = None
    for arm in sorted(arms, key=ORDER.index):
        if arm not in LIVE and reference is None and workload.keep_answers:
            results[arm] = {"arm": arm, "error": "replays agentkv's answers: run the agentkv arm too"}
            continue
        log(f"{name}: {arm} ...")
        spec = {**spec0, "arm": arm, "reference": None if arm in LIVE else reference}
        res = run_arm_subprocess(spec, out_dir / "runs", arm_timeout_s, reuse)
        results[arm] = res
        log(f"{name}: {arm}: " + (res["error"][-300:] if "error" in res else
                                 f"{res['wall_s']:.1f} s, prefill {res['prefill_computed']}"))
        if arm == REFERENCE and "error" not in res and workload.keep_answers:
            reference = _answers(res, workload)
    summary = {"workload": workload.name, "params": workload.params, "weights": weights, "notes": workload.notes,
               "turns": workload.num_turns, "agents": workload.num_agents,
               "max_tokens": workload.max_tokens, "formulas": workload.formulas,
               "accounting": accounting(workload, results), "exactness": exactness(results),
               "arms": results}
    summary["targets"] = targets(summary) if name == "tool-loop" else {}
    missed = [k for k, v in summary["targets"].items() if not v["met"]]
    if missed and profile_on_miss and "error" not in results.get(REFERENCE, {"error": 1}):
        log(f"{name}: targets missed ({', '.join(missed)}): profiling the agentkv arm ...")
        prof = run_arm_subprocess({**spec0, "arm": REFERENCE, "profile": True}, out_dir / "runs")
        summary["profile"] = {"arm": REFERENCE, "wall_s": prof.get("wall_s"),
                              "top": prof.get("profile") or [prof.get("error", "")]}
    return summary


def accounting(workload: wl.Workload, results: dict[str, dict]) -> dict:
    """The workload's reuse by radixbench's definition and by agentkv's (see workloads.py),
    and whether the agentkv arm's cache hits equal the prediction request by request."""
    ref = results.get(REFERENCE, {})
    if workload.keep_answers and ("error" in ref or not ref):
        return {}
    grid = _answers(ref, workload) if workload.keep_answers else None
    answer = (lambda t, a: grid[t][a]) if grid else None
    prompts = wl.all_prompts(workload, answer)
    expected = wl.agentkv_expected_hits(prompts, answer)
    out = {"radixbench": wl.radixbench_reuse(prompts),
           "agentkv_expected_hits": sum(map(sum, expected))}
    if "error" not in ref and ref:
        got = [[0] * workload.num_agents for _ in range(workload.num_turns)]
        for r in ref["records"]:
            got[r["turn"]][r["agent"]] = r["cached_len"]
        out["agentkv_measured_hits"] = sum(map(sum, got))
        out["agentkv_hits_match"] = got == expected
    return out


def exactness(results: dict[str, dict]) -> dict:
    """Greedy tokens of agentkv with the cache on vs off (must be equal: the contract), and
    how often each other arm agrees with agentkv (information only: other numerics)."""
    ref = results.get(REFERENCE)
    if not ref or "error" in ref:
        return {"checked": False}
    key = lambda r: (r["turn"], r["agent"])  # noqa: E731
    ref_recs = {key(r): r for r in ref["records"]}
    out: dict[str, Any] = {"checked": False, "agreement": {}}
    for arm, res in results.items():
        if arm == REFERENCE or "error" in res:
            continue
        field = "token_ids" if res["records"][0]["token_ids"] is not None else "text"
        same = [r[field] == ref_recs[key(r)][field] for r in res["records"]]
        out["agreement"][arm] = {"compared": field, "equal": sum(same), "of": len(same)}
        if arm in ("agentkv-nocache", "agentkv-http"):
            out["checked"] = True
            out.setdefault("mismatches", {})[arm] = len(same) - sum(same)
    # None = not checked (neither agentkv-nocache nor agentkv-http ran).
    out["exact"] = (not any(out.get("mismatches", {}).values())) if out["checked"] else None
    return out


def targets(summary: dict) -> dict:
    """Issue 6's acceptance on tool-loop: wall >= 4x lower than transformers, lower than
    llama.cpp; prefill computed >= 10x fewer than the no-cache arm."""
    arms = summary["arms"]
    ours = arms.get(REFERENCE, {})
    out = {}
    goals = [("transformers", "wall_s", 4.0), ("llamacpp", "wall_s", 1.0),
             ("agentkv-nocache", "prefill_computed", 10.0)]
    for peer, field, need in goals:
        other = arms.get(peer, {})
        if "error" in ours or "error" in other or not ours or not other:
            continue
        ratio = other[field] / max(ours[field], 1e-9)
        met = ratio >= need if need > 1 else ratio > need
        out[f"{field} vs {peer}"] = {"ratio": ratio, "need": need, "met": met}
    return out


def main(argv: list[str]) -> int:
    spec = json.loads(Path(argv[0]).read_text())
    Path(argv[1]).write_text(json.dumps(worker(spec)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

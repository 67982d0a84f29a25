"""`agentkv bench agents`: agent workloads on agentkv and its peers, one subprocess per arm
(so peak RSS is the arm's own); accounting, the exactness check and the acceptance targets;
JSON, Markdown and one PNG per workload.

Peers come from the `bench` extra (`make bench`); a peer that is not installed, or an arm
that runs past --arm-timeout, is reported as skipped.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentkv.bench import peers
from agentkv.bench import workloads as wl
from agentkv.bench.common import log
from agentkv.bench.driver import load_workload
from agentkv.bench.engine import add_engine_flags
from agentkv.bench.isolate import failed, reusable, run_isolated, why

REFERENCE = "agentkv"  # the arm whose answers the replaying arms append
DEFAULT_PEERS = "agentkv,agentkv-nocache,agentkv-http,llama-server,llamacpp,transformers"
DEFAULT_WORKLOADS = "fak-agents,tool-loop,shared-prefix,multi-turn"
# The expensive arms (they recompute every prompt) go last; each arm's result is kept in
# OUT/runs/ as soon as it finishes.
ORDER = ("agentkv", "agentkv-http", "llama-server", "llamacpp", "agentkv-nocache", "transformers")
LIVE = ("agentkv", "agentkv-nocache")  # append their own answers; the rest replay agentkv's


@dataclass(frozen=True, slots=True)
class RunConfig:
    """How `run_workload` runs its arms (the workload-independent settings)."""

    model: str = "smollm2"
    out_dir: Path = Path("bench/out")
    quick: bool = False
    weights: str = "resident"
    arm_timeout_s: float | None = None
    reuse: bool = False
    profile_on_miss: bool = True
    log: Callable[[str], None] = field(default=log)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--peers", default=DEFAULT_PEERS, help=f"comma list (default {DEFAULT_PEERS})")
    parser.add_argument(
        "--workload",
        default=DEFAULT_WORKLOADS,
        help=f"comma list of {', '.join(wl.WORKLOADS)} (default {DEFAULT_WORKLOADS})",
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="WORKLOAD.KEY=INT",
        help="override a workload size, e.g. tool-loop.turns=4 (repeatable)",
    )
    add_engine_flags(parser)
    parser.add_argument("--out", default="bench/out")
    parser.add_argument("--quick", action="store_true", help="tiny sizes (seconds per arm)")
    parser.add_argument(
        "--arm-timeout", type=float, default=None, metavar="S", help="stop an arm after S seconds (reported as skipped)"
    )
    parser.add_argument(
        "--reuse", action="store_true", help="take an arm's finished result from OUT/runs when its spec is identical"
    )
    parser.add_argument(
        "--no-profile", action="store_true", help="skip the cProfile rerun of agentkv when a target is missed"
    )


def overrides(items: list[str]) -> dict[str, dict[str, int]]:
    """--set WORKLOAD.KEY=INT items as {workload: {key: value}}."""
    out: dict[str, dict[str, int]] = {}
    for item in items:
        key, _, value = item.partition("=")
        name, _, size = key.partition(".")
        if not size or not value.lstrip("-").isdigit():
            raise ValueError(f"--set {item!r}: expected WORKLOAD.KEY=INT, e.g. tool-loop.turns=4")
        out.setdefault(name, {})[size] = int(value)
    return out


def run(args: argparse.Namespace) -> int:
    from agentkv.bench.arms import ARMS
    from agentkv.bench.llama_server import build_facts
    from agentkv.bench.long import isa_facts
    from agentkv.bench.report import write_all

    arms = [p for p in args.peers.split(",") if p]
    names = [w for w in args.workload.split(",") if w]
    sizes = overrides(args.set)
    for bad in [p for p in arms if p not in ARMS] + [w for w in names if w not in wl.WORKLOADS]:
        raise ValueError(
            f"unknown arm or workload {bad!r}; arms: {', '.join(ARMS)}; workloads: {', '.join(wl.WORKLOADS)}"
        )
    config = RunConfig(
        args.model, Path(args.out), args.quick, args.weights, args.arm_timeout, args.reuse, not args.no_profile
    )
    summaries = [run_workload(name, arms, config, sizes.get(name)) for name in names]
    stem = "agents-quick" if args.quick else "agents"
    paths = write_all(
        summaries,
        config.out_dir,
        stem,
        model=args.model,
        peers=arms,
        quick=args.quick,
        llamacpp_build=peers.llamacpp_build(),
        llama_server_build=build_facts(),
        isa=isa_facts(),
    )
    print(paths["md"].read_text())
    for kind, path in paths.items():
        print(f"wrote {kind}: {path}")
    return verdict(summaries)


def verdict(summaries: list[dict]) -> int:
    """Exit 1 loudly when exactness failed or the agentkv cache hits differ from the prediction."""
    rc = 0
    for s in summaries:
        ex = s.get("exactness", {})
        if ex.get("checked") and not ex.get("exact"):
            print(f"EXACTNESS FAILED on {s['workload']}: {ex.get('mismatches')}", file=sys.stderr)
            rc = 1
        acc = s.get("accounting") or {}
        if acc.get("agentkv_hits_match") is False:
            print(
                f"ACCOUNTING MISMATCH on {s['workload']}: expected {acc['agentkv_expected_hits']}, "
                f"measured {acc.get('agentkv_measured_hits')}",
                file=sys.stderr,
            )
            rc = 1
    return rc


def run_arm(spec: dict, config: RunConfig) -> dict:
    """One arm's worker in its own process (or its kept result with `config.reuse`)."""
    workdir = config.out_dir / "runs"
    tag = f"{spec['workload']}-{spec['arm']}{'-profile' if spec.get('profile') else ''}"
    reason = peers.missing(spec["arm"]) if spec["arm"] in peers.PEERS else None
    if spec["arm"] == "llama-server":
        from agentkv.bench.llama_server import server_missing

        reason = server_missing()
    if reason:
        return peers.skipped(reason)
    kept = reusable(spec, workdir, tag) if config.reuse else None
    return kept or run_isolated("agentkv.bench.driver:worker", spec, workdir, tag, config.arm_timeout_s)


def _answers(result: dict, workload: wl.Workload) -> list[list[list[int]]]:
    grid = [[[] for _ in range(workload.num_agents)] for _ in range(workload.num_turns)]
    for r in result["records"]:
        grid[r["turn"]][r["agent"]] = r["token_ids"]
    return grid


def run_arms(name: str, arms: list[str], config: RunConfig, sizes: dict | None) -> tuple[wl.Workload, dict]:
    """Every arm on workload `name`; the agentkv arm first: its answers are the transcript
    the replaying arms are fed."""
    spec0 = {
        "workload": name,
        "model": config.model,
        "quick": config.quick,
        "overrides": sizes or {},
        "weights": config.weights,
    }
    workload = load_workload(spec0)
    results: dict[str, dict] = {}
    reference = None
    for arm in sorted(arms, key=ORDER.index):
        if arm not in LIVE and reference is None and workload.keep_answers:
            results[arm] = {"arm": arm, "error": "replays agentkv's answers: run the agentkv arm too"}
            continue
        config.log(f"{name}: {arm} ...")
        res = run_arm({**spec0, "arm": arm, "reference": None if arm in LIVE else reference}, config)
        results[arm] = {"arm": arm, **res} if failed(res) else res
        config.log(
            f"{name}: {arm}: "
            + (why(res) if failed(res) else f"{res['wall_s']:.1f} s, prefill {res['prefill_computed']}")
        )
        if arm == REFERENCE and not failed(res) and workload.keep_answers:
            reference = _answers(res, workload)
    return workload, results


def run_workload(name: str, arms: list[str], config: RunConfig, sizes: dict | None = None) -> dict:
    """Every arm on workload `name` (one subprocess each), then accounting, exactness and
    targets; a missed target reruns the agentkv arm under cProfile."""
    workload, results = run_arms(name, arms, config, sizes)
    summary = {
        "workload": workload.name,
        "params": workload.params,
        "weights": config.weights,
        "notes": workload.notes,
        "turns": workload.num_turns,
        "agents": workload.num_agents,
        "max_tokens": workload.max_tokens,
        "formulas": workload.formulas,
        "accounting": accounting(workload, results),
        "exactness": exactness(results),
        "arms": results,
    }
    summary["targets"] = targets(summary) if name == "tool-loop" else {}
    missed = [k for k, v in summary["targets"].items() if not v["met"]]
    if missed and config.profile_on_miss and not failed(results.get(REFERENCE, {"error": 1})):
        config.log(f"{name}: targets missed ({', '.join(missed)}): profiling the agentkv arm ...")
        spec = {
            "workload": name,
            "model": config.model,
            "quick": config.quick,
            "overrides": sizes or {},
            "weights": config.weights,
            "arm": REFERENCE,
            "profile": True,
            "reference": None,
        }
        prof = run_arm(spec, config)
        summary["profile"] = {"arm": REFERENCE, "wall_s": prof.get("wall_s"), "top": prof.get("profile") or [why(prof)]}
    return summary


def accounting(workload: wl.Workload, results: dict[str, dict]) -> dict:
    """The workload's reuse by radixbench's definition and by agentkv's (see workloads.py),
    and whether the agentkv arm's cache hits equal the prediction request by request."""
    ref = results.get(REFERENCE, {})
    if workload.keep_answers and (not ref or failed(ref)):
        return {}
    grid = _answers(ref, workload) if workload.keep_answers else None
    answer = (lambda t, a: grid[t][a]) if grid else None
    prompts = wl.all_prompts(workload, answer)
    expected = wl.agentkv_expected_hits(prompts, answer)
    out = {"radixbench": wl.radixbench_reuse(prompts), "agentkv_expected_hits": sum(map(sum, expected))}
    if ref and not failed(ref):
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
    if not ref or failed(ref):
        return {"checked": False}
    key = lambda r: (r["turn"], r["agent"])  # noqa: E731
    ref_recs = {key(r): r for r in ref["records"]}
    out: dict[str, Any] = {"checked": False, "agreement": {}}
    for arm, res in results.items():
        if arm == REFERENCE or failed(res):
            continue
        compared = "token_ids" if res["records"][0]["token_ids"] is not None else "text"
        same = [r[compared] == ref_recs[key(r)][compared] for r in res["records"]]
        out["agreement"][arm] = {"compared": compared, "equal": sum(same), "of": len(same)}
        if arm in ("agentkv-nocache", "agentkv-http"):
            out["checked"] = True
            out.setdefault("mismatches", {})[arm] = len(same) - sum(same)
    # None = not checked (neither agentkv-nocache nor agentkv-http ran).
    out["exact"] = (not any(out.get("mismatches", {}).values())) if out["checked"] else None
    return out


def targets(summary: dict) -> dict:
    """The acceptance targets on tool-loop: wall >= 4x lower than transformers, lower than
    llama.cpp (its C++ server and llama-cpp-python); prefill computed >= 10x fewer than the no-cache arm."""
    arms = summary["arms"]
    ours = arms.get(REFERENCE, {})
    out = {}
    goals = [
        ("transformers", "wall_s", 4.0),
        ("llama-server", "wall_s", 1.0),
        ("llamacpp", "wall_s", 1.0),
        ("agentkv-nocache", "prefill_computed", 10.0),
    ]
    for peer, metric, need in goals:
        other = arms.get(peer, {})
        if not ours or not other or failed(ours) or failed(other):
            continue
        ratio = other[metric] / max(ours[metric], 1e-9)
        met = ratio >= need if need > 1 else ratio > need
        out[f"{metric} vs {peer}"] = {"ratio": ratio, "need": need, "met": met}
    return out

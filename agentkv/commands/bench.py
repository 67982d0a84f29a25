"""`agentkv bench agents`: agent workloads on agentkv and its peers; JSON, Markdown and PNGs.

Peers come from the `bench` extra (`pip install '.[bench]'`); llama-cpp-python compiles from
source for about 11 minutes on 2 cores. A peer that is not installed is reported, not fatal.
"""
from __future__ import annotations

import argparse
import importlib.util
import sys
import time
from pathlib import Path

DEFAULT_PEERS = "agentkv,agentkv-nocache,agentkv-http,llamacpp,transformers"
DEFAULT_WORKLOADS = "fak-agents,tool-loop,shared-prefix,multi-turn"
NEEDS = {"llamacpp": "llama_cpp", "transformers": "transformers"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("suite", choices=["agents"], help="the benchmark suite")
    parser.add_argument("--peers", default=DEFAULT_PEERS, help=f"comma list (default {DEFAULT_PEERS})")
    parser.add_argument("--workload", default=DEFAULT_WORKLOADS,
                        help=f"comma list of fak-agents, tool-loop, shared-prefix, multi-turn, session "
                             f"(default {DEFAULT_WORKLOADS})")
    parser.add_argument("--set", action="append", default=[], metavar="WORKLOAD.KEY=INT",
                        help="override a workload size, e.g. tool-loop.turns=4 (repeatable)")
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--weights", default="resident", choices=["resident", "f32"],
                        help="agentkv's in-process weights (the HTTP arm always runs resident)")
    parser.add_argument("--out", default="bench/out")
    parser.add_argument("--quick", action="store_true", help="tiny sizes (seconds per arm)")
    parser.add_argument("--arm-timeout", type=float, default=None, metavar="S",
                        help="stop an arm after S seconds (reported as timed out)")
    parser.add_argument("--reuse", action="store_true",
                        help="take an arm's finished result from OUT/runs when its spec is identical")
    parser.add_argument("--no-profile", action="store_true",
                        help="skip the cProfile rerun of agentkv when a target is missed")


def _overrides(items: list[str]) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for item in items:
        key, _, value = item.partition("=")
        name, _, field = key.partition(".")
        if not field or not value.lstrip("-").isdigit():
            raise ValueError(f"--set {item!r}: expected WORKLOAD.KEY=INT, e.g. tool-loop.turns=4")
        out.setdefault(name, {})[field] = int(value)
    return out


def _log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def _available(peers: list[str]) -> list[str]:
    keep = []
    for p in peers:
        mod = NEEDS.get(p)
        if mod and importlib.util.find_spec(mod) is None:
            hint = " (llama-cpp-python compiles ~11 min: pip install '.[bench]')" if p == "llamacpp" else ""
            _log(f"skipping {p}: {mod} is not installed{hint}")
            continue
        keep.append(p)
    return keep


def run(args: argparse.Namespace) -> int:
    from agentkv.bench.agents import run_workload
    from agentkv.bench.arms import ARMS
    from agentkv.bench.report import write_all
    from agentkv.bench.workloads import WORKLOADS

    try:
        peers = [p for p in args.peers.split(",") if p]
        names = [w for w in args.workload.split(",") if w]
        overrides = _overrides(args.set)
        for bad in [p for p in peers if p not in ARMS] + [w for w in names if w not in WORKLOADS]:
            raise ValueError(f"unknown arm or workload {bad!r}")
    except ValueError as exc:
        print(f"agentkv bench: {exc}", file=sys.stderr)
        return 2
    peers = _available(peers)
    out = Path(args.out)
    summaries = []
    for name in names:
        summaries.append(run_workload(name, peers, args.model, out, args.quick, overrides.get(name),
                                      profile_on_miss=not args.no_profile, log=_log,
                                      weights=args.weights, arm_timeout_s=args.arm_timeout,
                                      reuse=args.reuse))
    stem = "agents-quick" if args.quick else "agents"
    paths = write_all(summaries, out, stem, model=args.model, peers=peers, quick=args.quick)
    print(paths["md"].read_text())
    for kind, path in paths.items():
        print(f"wrote {kind}: {path}")
    return _verdict(summaries)


def _verdict(summaries: list[dict]) -> int:
    """Exit 1 loudly when exactness failed or the fak-agents accounting is off."""
    rc = 0
    for s in summaries:
        ex = s.get("exactness", {})
        if ex.get("checked") and not ex.get("exact"):
            print(f"EXACTNESS FAILED on {s['workload']}: {ex.get('mismatches')}", file=sys.stderr)
            rc = 1
        acc = s.get("accounting") or {}
        if acc.get("agentkv_hits_match") is False:
            print(f"ACCOUNTING MISMATCH on {s['workload']}: expected {acc['agentkv_expected_hits']}, "
                  f"measured {acc.get('agentkv_measured_hits')}", file=sys.stderr)
            rc = 1
    return rc

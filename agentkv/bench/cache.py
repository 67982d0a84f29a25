"""`agentkv bench cache`: prefix-cache reuse on agent workloads, agentkv with the radix cache
on vs off in the same run.

  fak-agents  fak radixbench's agents workload, prompt-only: must reproduce 6360 prompt
              tokens, 5512 reused, hit rate 86.7% exactly.
  session     lcg tokens: a shared prefix, a per-agent task, then per turn the model's greedy
              answer (kept) and a tool result; sizes from the flags (recorded in the JSON).

radixbench reuse = each request's longest common prefix with anything sent before; agentkv
hits = its radix cache's hit tokens (what finished requests left, prompt + answer minus the
last token, plus the in-flight prompts of the same turn, capped at len(prompt) - 1).
Exits 1 when greedy tokens differ between cache on and off, or the hits differ from the
prediction.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from agentkv.bench.agents import RunConfig, run_workload
from agentkv.bench.common import bar_plot, envelope, print_paths, table, write_outputs
from agentkv.bench.engine import add_engine_flags
from agentkv.bench.isolate import failed, why

ARMS = ["agentkv", "agentkv-nocache"]
SIZES = (("agents", 4), ("turns", 4), ("prefix", 512), ("user", 32), ("answer", 16), ("tool", 128))
FAK_EXPECTED = (6360, 5512)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_engine_flags(parser)
    for name, default in SIZES:
        parser.add_argument(f"--{name}", type=int, default=default, help=f"session {name} (default {default})")
    parser.add_argument(
        "--arm-timeout", type=float, default=None, metavar="S", help="stop an arm after S seconds (reported as skipped)"
    )
    parser.add_argument("--out", default="bench/out")


def _row(summary: dict) -> list:
    on, off = summary["arms"]["agentkv"], summary["arms"]["agentkv-nocache"]
    acc = summary["accounting"]
    rb = acc["radixbench"]
    return [
        summary["workload"],
        rb["total_tokens"],
        rb["reused_tokens"],
        acc["agentkv_measured_hits"],
        f"{on['hit_rate']:.1%}",
        f"{on['prefill_computed']} / {off['prefill_computed']}",
        f"{off['prefill_computed'] / max(on['prefill_computed'], 1):.1f}×",
        f"{on['wall_s']:.1f} / {off['wall_s']:.1f}",
        f"{off['wall_s'] / on['wall_s']:.2f}×",
        summary["exactness"]["exact"],
    ]


def problems(summaries: list[dict]) -> list[str]:
    """What is wrong with the run: failed arms, inexact tokens, hits off the prediction."""
    bad = [f"{s['workload']}: {arm} {why(r)}" for s in summaries for arm, r in s["arms"].items() if failed(r)]
    if bad:
        return bad
    bad = [s["workload"] for s in summaries if not s["exactness"]["exact"] or not s["accounting"]["agentkv_hits_match"]]
    fak = summaries[0]["accounting"]
    if (fak["radixbench"]["total_tokens"], fak["radixbench"]["reused_tokens"]) != FAK_EXPECTED or fak[
        "agentkv_measured_hits"
    ] != FAK_EXPECTED[1]:
        bad.append(f"fak-agents accounting (want {FAK_EXPECTED[0]} / {FAK_EXPECTED[1]})")
    return bad


def run(args: argparse.Namespace) -> int:
    out = Path(args.out)
    sizes = {name: getattr(args, name) for name, _ in SIZES}
    config = RunConfig(args.model, out, weights=args.weights, arm_timeout_s=args.arm_timeout)
    summaries = [run_workload("fak-agents", ARMS, config), run_workload("session", ARMS, config, sizes)]
    for s in summaries:
        for r in s["arms"].values():
            r.pop("records", None)  # the table's figures are enough here
    payload = envelope("cache", model=args.model, weights=args.weights, workloads=summaries)
    bad = problems(summaries)
    if bad:
        md = [f"FAILED: {b}" for b in bad]
    else:
        md = table(
            [
                "workload",
                "prompt tok",
                "radixbench reused",
                "agentkv hits",
                "hit rate",
                "prefill on / off",
                "fewer",
                "wall s on / off",
                "speedup",
                "exact",
            ],
            [_row(s) for s in summaries],
        ) + [""]
        md += [f"- {s['workload']} params: {s['params']}; formulas: {s['formulas']}" for s in summaries]
        groups = {
            f"{s['workload']}: prefill tokens": {
                f"cache {k}": s["arms"][a]["prefill_computed"]
                for k, a in (("on", "agentkv"), ("off", "agentkv-nocache"))
            }
            for s in summaries
        }
        png = bar_plot(out / "cache.png", "agentkv prefix cache on vs off (same run)", groups, "tokens")
        md.append(f"\n![cache]({png.name})" if png else "")
    paths = write_outputs(out, "cache", payload, md)
    if not bad and png:
        paths["png"] = png
    print_paths(paths)
    if bad:
        print(f"FAILED: {bad}", file=sys.stderr)
        return 1
    return 0

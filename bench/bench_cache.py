"""Prefix-cache reuse on agent workloads: agentkv with the radix cache on vs off, same run.

    python bench/bench_cache.py [--model smollm2] [--agents 4 --turns 4 --prefix 512
                                 --answer 16 --tool 128 --user 32] [--out bench/out]

Two workloads (agentkv.bench.workloads):
  fak-agents  fak radixbench's agents workload, prompt-only (max_tokens=1): must reproduce
              6360 prompt tokens, 5512 reused, hit rate 86.7% exactly.
  session     lcg tokens: a shared prefix, a per-agent task, then per turn the model's greedy
              answer (kept) and a tool result. Issue 4's size is 8 agents x 10 turns, prefix
              1024, answer 64, tool 256 (pass those flags); the default is scaled to fit
              ~10 minutes on 2 cores. The parameters are recorded in the JSON.

Definitions (both are printed):
  radixbench reuse   each request's longest common prefix with anything sent before.
  agentkv hits       the radix cache's hit tokens: each request matches what finished
                     requests left (prompt + answer minus its last token, whose KV is never
                     computed) and the in-flight prompts of its own turn, capped at
                     len(prompt) - 1 (the last token is computed for its logits).
  On fak-agents they agree (5512): every request strictly extends earlier ones. On
  session workloads agentkv computes one more token per agent per later turn.
  hit rate           hit tokens / prompt tokens sent (radixbench's denominator; the engine's
                     prefix_queried_tokens excludes each prompt's last token).
Exits 1 when greedy tokens differ between cache on and off, or the hits differ from the
prediction.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from agentkv.bench.agents import run_workload  # noqa: E402
from agentkv.bench.report import envelope, write_json  # noqa: E402
from bench.common import progress  # noqa: E402

ARMS = ["agentkv", "agentkv-nocache"]


def _row(summary: dict) -> list[str]:
    on, off = summary["arms"]["agentkv"], summary["arms"]["agentkv-nocache"]
    acc = summary["accounting"]
    rb = acc["radixbench"]
    return [summary["workload"], str(rb["total_tokens"]), str(rb["reused_tokens"]),
            str(acc["agentkv_measured_hits"]), f"{on['hit_rate']:.1%}",
            f"{on['prefill_computed']} / {off['prefill_computed']}",
            f"{off['prefill_computed'] / max(on['prefill_computed'], 1):.1f}x",
            f"{on['wall_s']:.1f} / {off['wall_s']:.1f}", f"{off['wall_s'] / on['wall_s']:.2f}x",
            str(summary["exactness"]["exact"])]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2")
    for name, default in (("agents", 4), ("turns", 4), ("prefix", 512), ("user", 32),
                          ("answer", 16), ("tool", 128)):
        ap.add_argument(f"--{name}", type=int, default=default, help=f"session {name} (default {default})")
    ap.add_argument("--weights", default="resident", choices=["resident", "f32"])
    ap.add_argument("--out", default="bench/out")
    args = ap.parse_args(argv)
    out = Path(args.out)
    sizes = {k: getattr(args, k) for k in ("agents", "turns", "prefix", "user", "answer", "tool")}
    summaries = [run_workload("fak-agents", ARMS, args.model, out, log=progress, weights=args.weights),
                 run_workload("session", ARMS, args.model, out, overrides=sizes, log=progress,
                              weights=args.weights)]
    for s in summaries:
        for arm, r in s["arms"].items():
            if "error" in r:
                print(f"{s['workload']}: {arm} failed: {r['error']}", file=sys.stderr)
                return 1
            r.pop("records", None)  # the table's figures are enough here
    path = write_json(out / "cache.json", envelope(benchmark="cache", model=args.model,
                                                   weights=args.weights, workloads=summaries))
    head = ["workload", "prompt tok", "radixbench reused", "agentkv hits", "hit rate",
            "prefill on / off", "fewer", "wall s on / off", "speedup", "exact"]
    rows = [head] + [_row(s) for s in summaries]
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    for r in rows:
        print("  ".join(c.rjust(w) for c, w in zip(r, widths)))
    for s in summaries:
        print(f"{s['workload']} params: {s['params']}; formulas: {s['formulas']}")
    print(f"wrote {path}")
    bad = [s["workload"] for s in summaries
           if not s["exactness"]["exact"] or not s["accounting"]["agentkv_hits_match"]]
    fak = summaries[0]["accounting"]["radixbench"]
    if (fak["total_tokens"], fak["reused_tokens"]) != (6360, 5512) or \
            summaries[0]["accounting"]["agentkv_measured_hits"] != 5512:
        bad.append("fak-agents accounting (want 6360 / 5512)")
    if bad:
        print(f"FAILED: exactness or accounting on {bad}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

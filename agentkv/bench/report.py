"""`agentkv bench agents` output: the per-workload Markdown table and the three-panel PNG."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from agentkv.bench.common import envelope, header, save_figure, write_json
from agentkv.bench.common import fmt as _fmt
from agentkv.bench.isolate import failed, why


def markdown(summary: dict) -> str:
    """One workload's table: an arm a row, plus accounting, exactness and targets."""
    arms = summary["arms"]
    base = arms.get("agentkv", {}).get("wall_s")
    lines = [
        f"### {summary['workload']} — {json.dumps(summary['params'])}",
        "",
        "| arm | wall s | × agentkv | prefill computed | hit rate | TTFT p50 s | TTFT p95 s "
        "| decode tok/s | peak RSS MiB | how it runs |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, r in arms.items():
        if failed(r):
            lines.append(f"| {name} | {why(r)} | | | | | | | | |")
            continue
        rel = r["wall_s"] / base if base else None
        lines.append(
            f"| {name} | {_fmt(r['wall_s'], '.1f')} | {_fmt(rel)} | {_fmt(r['prefill_computed'])} "
            f"| {_fmt(r['hit_rate'], '.1%')} | {_fmt(r['ttft_p50_s'], '.3f')} "
            f"| {_fmt(r['ttft_p95_s'], '.3f')} | {_fmt(r['decode_tok_s'], '.1f')} "
            f"| {_fmt(r['peak_rss_mib'], '.0f')} | {r['notes']} |"
        )
    lines += ["", *_facts(summary)]
    return "\n".join(lines) + "\n"


def _facts(summary: dict) -> list[str]:
    out = []
    acc = summary.get("accounting") or {}
    if acc:
        rb = acc["radixbench"]
        out.append(
            f"- accounting: {rb['total_tokens']} prompt tokens, radixbench reuse "
            f"{rb['reused_tokens']} ({rb['hit_rate']:.1%}, ceiling {rb['token_ceiling']:.1f}×); "
            f"agentkv expected hits {acc['agentkv_expected_hits']}, measured "
            f"{acc.get('agentkv_measured_hits')}, per-request match: {acc.get('agentkv_hits_match')}"
        )
    if summary.get("formulas"):
        out.append(f"- docs/design.md formulas: {json.dumps(summary['formulas'])}")
    ex = summary.get("exactness") or {}
    exact = {True: "true", False: "FALSE", None: "not checked (run agentkv-nocache)"}[ex.get("exact")]
    out.append(
        f"- exactness (agentkv cache on == off, greedy tokens): {exact}; "
        f"agreement with agentkv: {json.dumps(ex.get('agreement', {}))}"
    )
    for name, t in (summary.get("targets") or {}).items():
        out.append(
            f"- target {name}: {t['ratio']:.2f}× (need {'>=' if t['need'] > 1 else '>'} "
            f"{t['need']:g}×) — {'met' if t['met'] else 'MISSED'}"
        )
    if summary.get("profile"):
        out += [
            "",
            f"cProfile of the {summary['profile']['arm']} arm (top by cumulative time):",
            "",
            "```",
            *summary["profile"]["top"],
            "```",
        ]
    return out


def plot(summary: dict, path: Path) -> Path | None:
    """Time per turn, cumulative prefill tokens and wall-time ratio, one PNG per workload."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    arms = {k: v for k, v in summary["arms"].items() if not failed(v)}
    if not arms:
        return None
    fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(15, 4.2))
    for name, r in arms.items():
        turns = range(1, len(r["turn_s"]) + 1)
        ax1.plot(turns, r["turn_s"], marker="o", label=name)
        if r.get("cum_prefill"):
            ax2.plot(turns, r["cum_prefill"], marker="o", label=name)
    ax1.set(title="time per turn", xlabel="turn", ylabel="seconds")
    ax2.set(title="cumulative prefill tokens computed", xlabel="turn", ylabel="tokens")
    base = arms.get("agentkv", {}).get("wall_s")
    names = list(arms)
    ratios = [arms[n]["wall_s"] / base if base else 0 for n in names]
    ax3.bar(names, ratios, color="tab:blue")
    ax3.set(title="wall time ÷ agentkv's (higher = agentkv faster)", ylabel="×")
    ax3.tick_params(axis="x", rotation=30)
    from matplotlib.ticker import MaxNLocator

    for ax in (ax1, ax2):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    fig.suptitle(f"{summary['workload']} {json.dumps(summary['params'])}", fontsize=9)
    return save_figure(fig, path)


def write_all(summaries: list[dict], out_dir: Path, stem: str, **fields: Any) -> dict[str, Path]:
    """JSON with every figure, a Markdown report and one PNG per workload."""
    payload = envelope("agents", **fields, workloads=summaries)
    paths = {"json": write_json(out_dir / f"{stem}.json", payload)}
    md = header(payload)
    for s in summaries:
        md.append(markdown(s))
        png = plot(s, out_dir / f"{stem}-{s['workload']}.png")
        if png:
            paths[f"png-{s['workload']}"] = png
            md.append(f"![{s['workload']}]({png.name})\n")
    paths["md"] = out_dir / f"{stem}.md"
    paths["md"].write_text("\n".join(md))
    return paths

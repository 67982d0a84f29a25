"""The output of `agentkv bench long`: the Markdown tables (each figure of each server, the
ratio against its target, the decode fractions of the bandwidth ceiling), the notes the tables
do not carry, and the PNG of the ratios against their targets."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agentkv.bench.common import fmt, print_paths, table, write_outputs
from agentkv.bench.isolate import failed, why
from agentkv.bench.peers import THREADS, skipped

COLUMN = {
    "agentkv": "agentkv",
    "agentkv-int8": "agentkv int8",
    "llama-server": "llama-server",
    "llamacpp": "llama_cpp.server",
}


def _cell(result: dict, figure: str, key: str) -> Any:
    if failed(result):
        return why(result)[:60]
    return result.get(figure, {}).get(key)


def header(payload: dict) -> list[str]:
    """The run's conditions: bandwidth, load, CPU and ISA, and how each peer was built."""
    bw, load = payload["bandwidth"], payload["load_average"]
    return [
        f"memory bandwidth {bw['best_gbs']:.1f} GB/s (best of before and after); load average before "
        f"{load['before'][0]:.2f}, after {load['after'][0]:.2f}; {THREADS} threads per server; "
        f"CPU: {payload['machine']['cpu']}; agentkv kernels: {payload['isa']['agentkv_kernels']}"
        f"{' (forced by AGENTKV_CPU_ISA)' if payload['isa']['forced'] else ''}"
        f", int8 kernels: {payload['isa'].get('agentkv_int8_kernels', 'avx512-vnni')}",
        "",
        f"llama-server: {_server_line(payload)}",
        "",
        f"llama_cpp.server: {payload['llamacpp_build'].get('system_info', why(payload['llamacpp_build']))}",
        "",
    ]


def markdown(payload: dict) -> list[str]:
    md = header(payload)
    keys = {
        "replay": "wall_s",
        "fleet": "wall_s",
        "ttft": "ttft_s",
        "decode": "decode_tok_s",
        "streams": "aggregate_tok_s",
    }
    units = {"replay": "wall s", "fleet": "wall s", "ttft": "s", "decode": "tok/s", "streams": "aggregate tok/s"}
    rows = []
    int8 = "agentkv-int8" in payload["arms"]
    arms = [a for a in COLUMN if int8 or a != "agentkv-int8"]
    for model, block in payload["models"].items():
        res, d = block["results"], block["derived"]
        for figure in block["figures"]:
            r = d["ratios"][figure]
            row = [model, f"{figure} ({units[figure]})"]
            row += [_cell(res.get(a, skipped("not run")), figure, keys[figure]) for a in arms]
            row += [d.get("peer"), r["agentkv_over_peer"], *([r.get("int8_over_peer")] if int8 else [])]
            row += [r["target"], r["met"]]
            rows.append(row + ([r.get("int8_met")] if int8 else []))
    ratio_heads = ["peer", "agentkv ÷ peer ×", *(["int8 ÷ peer ×"] if int8 else []), "target ×", "met"]
    md += table(["model", "figure", *[COLUMN[a] for a in arms], *ratio_heads, *(["int8 met"] if int8 else [])], rows)
    md += ["", "decode as a fraction of the ceiling (weight bytes per token ÷ bandwidth):", ""]
    rows = []
    for model, block in payload["models"].items():
        d = block["derived"]
        for arm, f in d["of_ceiling"].items():
            streams = block["results"][arm].get("streams", {})
            rows.append(
                [
                    model,
                    arm,
                    d["decode_ceiling_tok_s"],
                    f["decode"],
                    f["decode_met"],
                    f["streams_aggregate"],
                    streams.get("max_concurrent"),
                ]
            )
    md += table(
        ["model", "arm", "ceiling tok/s", "decode of ceiling", "met", "streams aggregate of ceiling", "overlapped"],
        rows,
    )
    md += ["", *notes(payload["models"])]
    md += [
        "",
        f"targets: replay ≥ 8×, fleet ≥ 4×, TTFT ≥ 3×, decode ≥ 1.5× SmolLM2 / ≥ 1.3× Gemma-3, "
        f"decode ≥ {payload['targets']['of_ceiling']:.0%} of the ceiling",
    ]
    return md


def _server_line(payload: dict) -> str:
    """llama-server's CPU build flags and its system-info line (from the first run's log)."""
    facts = payload.get("llama_server_build", {})
    if failed(facts):
        return why(facts)
    flags = " ".join(f"{k}={v}" for k, v in facts.get("build_flags", {}).items() if k.startswith("GGML_AVX"))
    info = next(
        (
            r.get("system_info")
            for b in payload["models"].values()
            for a, r in b["results"].items()
            if a == "llama-server"
        ),
        None,
    )
    return f"{facts['binary']}; {flags or 'build flags unknown'}; {info or 'no system-info line'}"


def notes(models: dict[str, Any]) -> list[str]:
    """What the tables do not say: prompt lengths as each server counted them, agentkv's
    reuse in the replay, short answers, and whether the peer overlapped its streams."""
    out = []
    for model, block in models.items():
        res = {a: r for a, r in block["results"].items() if not failed(r)}
        if all("ttft" in r for r in res.values()) and res:
            for arm, r in res.items():
                t = r["ttft"]
                out.append(
                    f"- {model}: {arm}: TTFT prompt of {t['prompt_tokens']} tokens (its own count), prefill "
                    f"{fmt(t['prefill_tok_s'], '.0f')} tok/s, then decode {fmt(t['decode_at_depth_tok_s'], '.1f')} "
                    "tok/s at that depth"
                )
        replay = res.get("agentkv", {}).get("replay")
        if replay and replay["prompt_tokens"]:
            out.append(
                f"- {model}: agentkv's replay reused {replay['cached_tokens']} of {replay['prompt_tokens']} "
                "prompt tokens"
            )
        for arm, r in res.items():
            if r.get("replay", {}).get("short_answers"):
                out.append(f"- {model}: {arm} stopped {r['replay']['short_answers']} replay answers early (EOS)")
            if r.get("streams", {}).get("max_concurrent") == 1 and r["streams"]["streams"] > 1:
                out.append(f"- {model}: {arm} served its {r['streams']['streams']} streams one after another")
    return out


def plot(path: Path, models: dict[str, Any]) -> Path | None:
    """One panel per model: agentkv ÷ peer per figure, its target a red tick; None if no
    figure has a ratio."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from agentkv.bench.common import save_figure

    panels = {m: {f: r for f, r in b["derived"]["ratios"].items() if r["agentkv_over_peer"]} for m, b in models.items()}
    panels = {m: bars for m, bars in panels.items() if bars}
    if not panels:
        return None
    fig, axes = plt.subplots(1, len(panels), figsize=(4.5 * len(panels), 3.8), squeeze=False)
    for ax, (model, bars) in zip(axes[0], panels.items()):
        names = list(bars)
        ax.bar(names, [bars[f]["agentkv_over_peer"] for f in names], color="tab:blue")
        for x, f in enumerate(names):
            if bars[f]["target"]:
                ax.hlines(bars[f]["target"], x - 0.4, x + 0.4, colors="tab:red", label="target" if x == 0 else None)
        ax.axhline(1.0, color="gray", lw=0.8)
        ax.set(title=model, ylabel=f"agentkv ÷ {models[model]['derived'].get('peer')} (×)")
        ax.grid(alpha=0.3, axis="y")
    fig.suptitle("same GGUF, same run, over HTTP; higher = agentkv faster; red = target", fontsize=8)
    return save_figure(fig, path)


def report(payload: dict, out: Path) -> None:
    md = markdown(payload)
    png = plot(out / "long.png", payload["models"])
    if png:
        md.append(f"\n![long]({png.name})")
    paths = write_outputs(out, "long", payload, md)
    print_paths({**paths, **({"png": png} if png else {})})

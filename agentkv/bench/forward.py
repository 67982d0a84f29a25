"""`agentkv bench forward`: prefill and decode speed of one model, single stream, in one run:
agentkv vs transformers (f32, same weights) vs llama.cpp (same GGUF), each arm in a fresh
process with THREADS threads. Also the memory each arm's process grew by."""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from types import SimpleNamespace

from agentkv.bench import peers
from agentkv.bench.common import (
    bar_plot,
    best_of,
    envelope,
    log,
    memory_mib,
    print_paths,
    prompt_ids,
    table,
    time_decode,
    write_outputs,
)
from agentkv.bench.engine import ENGINE_KNOBS, add_engine_flags, build_engine
from agentkv.bench.isolate import failed, run_isolated, why

ARMS = ("agentkv", "transformers", "llamacpp")
SPEEDS = ("prefill_tok_s", "decode_tok_s")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_engine_flags(parser, weights="resident", knobs=ENGINE_KNOBS)
    add_speed_flags(parser)
    parser.add_argument(
        "--peers", default="transformers,llamacpp", help="comma list of transformers, llamacpp (default both)"
    )
    parser.add_argument("--out", default="bench/out")


def add_speed_flags(parser: argparse.ArgumentParser) -> None:
    """The prompt, decode and timing flags forward and quant share."""
    parser.add_argument("--prompt-len", type=int, default=512)
    parser.add_argument("--decode-len", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3, help="prefill runs per arm (best counts)")
    parser.add_argument(
        "--arm-timeout",
        type=float,
        default=300.0,
        metavar="S",
        help="stop an arm after S seconds (reported as skipped)",
    )


def _prefill(engine, ids: list[int]) -> None:
    from agentkv.runtime.params import SamplingParams

    engine.add_request(
        f"prefill-{time.monotonic_ns()}", ids, SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
    )
    while engine.has_unfinished():
        engine.step()


def measure_agentkv(spec: dict) -> tuple[dict, object]:
    """agentkv's prefill/decode speed and memory growth; also returns the engine (for quant)."""
    import torch

    from agentkv.hal import kernels

    torch.set_num_threads(peers.THREADS)
    if spec.get("backend", "cpu") == "cpu":
        kernels.load()  # the runtime's first-use memory (kernel module, thread pools) is not the model's
    torch.nn.functional.linear(torch.ones(16, 64), torch.ones(64, 64))
    before = memory_mib()
    max_len = spec["prompt_len"] + spec["decode_len"] + 32  # a small KV store: RSS measures the model
    engine = build_engine(
        SimpleNamespace(**spec), prefix_cache=False, num_blocks=-(-max_len // 16) + 2, max_model_len=max_len
    )
    ids = prompt_ids(engine.vocab_size, spec["prompt_len"])
    # Weights are memory-mapped (every engine): they become resident when a forward pass
    # first reads them, so memory is measured after the warm-up.
    _prefill(engine, ids[:32])
    loaded = memory_mib()
    prefill_s = best_of(lambda: _prefill(engine, ids), spec["repeats"])
    n, decode_s = time_decode(engine, ids, spec["decode_len"])
    isa = engine.backend.identity.isa or f"none ({engine.backend.name})"
    return {
        "prefill_tok_s": len(ids) / prefill_s,
        "decode_tok_s": n / decode_s,
        "kernels": isa,
        **_grown(before, loaded),
    }, engine


def _grown(before: dict, after: dict) -> dict:
    return {
        "resident_mib": after["rss"] - before["rss"],
        "private_mib": after["uss"] - before["uss"],
        "file_mapped_mib": after["shared"] - before["shared"],
    }


def measure_peer(spec: dict) -> dict:
    """A peer's prefill/decode speed and memory growth on the same GGUF."""
    from agentkv.formats.resolve import open_model, resolve_model_path

    path = str(resolve_model_path(spec["model"]))
    ids = prompt_ids(open_model(spec["model"]).hparams.vocab_size, spec["prompt_len"])
    before = memory_mib()
    if spec["arm"] == "llamacpp":
        llm = peers.load_llamacpp(path, spec["prompt_len"] + spec["decode_len"] + 16)
        out = peers.time_llamacpp(llm, ids, spec["decode_len"], spec["repeats"])
        out["kernels"] = peers.llamacpp_build()["system_info"]
    else:
        model = peers.load_transformers(path)
        out = peers.time_transformers(model, ids, spec["decode_len"], spec["repeats"])
    return {**out, **_grown(before, memory_mib())}


def worker(spec: dict) -> dict:
    if spec["arm"] in peers.PEERS:
        return measure_peer(spec)
    return measure_agentkv(spec)[0]


def run_arms(target: str, specs: dict[str, dict], out_dir: Path, timeout_s: float) -> dict:
    """Each arm's `target(spec)` in its own process; a missing peer or a timeout is skipped."""
    if any(spec["arm"] not in peers.PEERS for spec in specs.values()):
        from agentkv.hal.kernels import load

        load()  # the one-time kernel compile is not part of any arm's time limit
    results = {}
    for tag, spec in specs.items():
        reason = peers.missing(spec["arm"]) if spec["arm"] in peers.PEERS else None
        log(f"{tag} ...")
        results[tag] = peers.skipped(reason) if reason else run_isolated(target, spec, out_dir / "runs", tag, timeout_s)
        log(
            f"{tag}: "
            + (why(results[tag]) if failed(results[tag]) else ", ".join(f"{k} {results[tag][k]:.1f}" for k in SPEEDS))
        )
    return results


def ratios(results: dict, ours: str = "agentkv") -> dict:
    """agentkv ÷ each peer that ran, per speed (higher = agentkv faster)."""
    mine = results.get(ours, {})
    if failed(mine) or not mine:
        return {}
    return {
        f"vs_{peer}": {k: mine[k] / r[k] for k in SPEEDS}
        for peer, r in results.items()
        if peer != ours and not failed(r)
    }


def run(args: argparse.Namespace) -> int:
    arms = ["agentkv"] + [p for p in args.peers.split(",") if p]
    for bad in [a for a in arms[1:] if a not in peers.PEERS]:
        raise ValueError(f"--peers: unknown peer {bad!r}; choose from {', '.join(peers.PEERS)}")
    base = {
        "model": args.model,
        "backend": args.backend,
        "weights": args.weights,
        "kv_cache_dtype": args.kv_cache_dtype,
        "prompt_len": args.prompt_len,
        "decode_len": args.decode_len,
        "repeats": args.repeats,
    }
    out = Path(args.out)
    results = run_arms("agentkv.bench.forward:worker", {a: {**base, "arm": a} for a in arms}, out, args.arm_timeout)
    payload = envelope(
        "forward",
        **base,
        threads=peers.THREADS,
        llamacpp_build=peers.llamacpp_build(),
        results=results,
        ratios=ratios(results),
    )
    stem = f"forward-{args.model}-{args.weights}"
    rows = [
        [
            arm,
            *(("—", "—") if failed(r) else (r["prefill_tok_s"], r["decode_tok_s"])),
            why(r) if failed(r) else r.get("kernels", ""),
        ]
        for arm, r in results.items()
    ]
    md = table(["engine", "prefill tok/s", "decode tok/s", "kernels / status"], rows) + [""]
    md += [
        f"- agentkv {peer}: prefill ×{r['prefill_tok_s']:.2f}, decode ×{r['decode_tok_s']:.2f}"
        for peer, r in payload["ratios"].items()
    ]
    groups = {k: {a: r.get(k) for a, r in results.items() if not failed(r)} for k in SPEEDS}
    png = bar_plot(
        out / f"{stem}.png",
        f"{args.model} ({args.weights}), prompt {args.prompt_len}, decode {args.decode_len}",
        groups,
        "tokens/s",
    )
    if png:
        md.append(f"\n![{stem}]({png.name})")
    paths = write_outputs(out, stem, payload, md)
    if png:
        paths["png"] = png
    print_paths(paths)
    return 0

"""`agentkv bench gptoss`: a synthetic GGUF with gpt-oss-20b's shapes (bench/gptoss_model.py,
MXFP4 experts, random weights, ~12 GiB, written once into the cache folder) on agentkv and on
llama.cpp's own `llama-server`, same file, THREADS threads each, one run each: load time,
resident memory against the file size (target <= 1.1x), a 512-token prefill and single-stream
decode, and decode against the bandwidth ceiling of the bytes one token reads (dense tensors,
one embedding row, the top-4 experts of each layer). Target >= 1.5x llama.cpp on prefill and
decode; below 1.0x the issue is not done. The machine is shared: figures are ratios within one
run, with the load average before and after."""

from __future__ import annotations

import argparse
import os
import time
from dataclasses import asdict
from pathlib import Path
from types import SimpleNamespace

from agentkv.bench import peers
from agentkv.bench.common import bar_plot, envelope, log, memory_mib, print_paths, prompt_ids, table, write_outputs
from agentkv.bench.gptoss_model import GptOssShape, synthetic_gptoss
from agentkv.bench.isolate import failed, run_isolated, why
from agentkv.bench.moe import decode_bytes, verdict
from agentkv.bench.quant import SPEED_TARGET, bandwidth_gbs

SPEEDS = ("prefill_tok_s", "decode_tok_s")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    defaults = GptOssShape()
    for name in ("layers", "experts", "top_k", "d", "ffn", "heads", "kv_heads", "vocab"):
        parser.add_argument(f"--{name.replace('_', '-')}", type=int, default=getattr(defaults, name))
    parser.add_argument("--prompt-len", type=int, default=512)
    parser.add_argument("--decode-len", type=int, default=32)
    parser.add_argument("--cache-dir", default=None, help="where the synthetic GGUF is kept (default ~/.cache)")
    parser.add_argument("--llama-server", default=None, help="llama-server binary (default: the cached build)")
    parser.add_argument("--arm-timeout", type=float, default=1800.0, metavar="S")
    parser.add_argument("--out", default="bench/results/gptoss")


def agentkv_worker(spec: dict) -> dict:
    """agentkv's load time, its first (untimed in the ratios) prefill, which pages the mapped
    experts in, RSS after it, then one timed prefill and one decode run."""
    import torch

    from agentkv.bench.common import time_decode
    from agentkv.bench.engine import build_engine
    from agentkv.bench.forward import _prefill

    torch.set_num_threads(peers.THREADS)
    before = memory_mib()
    started = time.perf_counter()
    max_len = spec["prompt_len"] + spec["decode_len"] + 32
    args = SimpleNamespace(model=spec["model"], backend="cpu", weights="resident")
    engine = build_engine(args, prefix_cache=False, num_blocks=-(-max_len // 16) + 2, max_model_len=max_len)
    load_s = time.perf_counter() - started
    ids = prompt_ids(engine.vocab_size, spec["prompt_len"])
    started = time.perf_counter()
    _prefill(engine, prompt_ids(engine.vocab_size, spec["prompt_len"], seed=1))  # no prefix cache: all computed
    first_s = time.perf_counter() - started
    started = time.perf_counter()
    _prefill(engine, ids)
    prefill_s = time.perf_counter() - started
    n, decode_s = time_decode(engine, ids, spec["decode_len"])
    after = memory_mib()
    return {
        "load_s": load_s,
        "first_prefill_s": first_s,
        "prefill_tok_s": len(ids) / prefill_s,
        "decode_tok_s": n / decode_s,
        "rss_mib": after["rss"] - before["rss"],
        "kernels": engine.backend.identity.isa,
    }


def llama_server_arm(spec: dict, binary: Path, work: Path, timeout_s: float) -> dict:
    """llama-server's load time (until healthy), RSS, and its own prompt/decode timings."""
    import psutil

    from agentkv.bench.llama_server import LlamaServer

    if not binary.exists():
        return peers.skipped(f"no llama-server at {binary} (bench/build_llama_server.sh builds it)")
    work.mkdir(parents=True, exist_ok=True)
    ids = prompt_ids(spec["vocab"], spec["prompt_len"])
    started = time.perf_counter()
    n_ctx = spec["prompt_len"] + spec["decode_len"] + 32
    server = LlamaServer(binary, spec["model"], ["-c", str(n_ctx), "-np", "1"], work / "llama-server-gptoss.log")
    try:
        server.start(timeout_s)
    except (OSError, RuntimeError):
        server.stop()
        raise
    load_s = time.perf_counter() - started
    try:
        warm = prompt_ids(spec["vocab"], spec["prompt_len"], seed=1)
        first = server.post("/completion", {"prompt": warm, "n_predict": 1, "cache_prompt": False})["timings"]
        pre = server.post("/completion", {"prompt": ids, "n_predict": 1, "cache_prompt": False})["timings"]
        body = {"prompt": ids, "n_predict": spec["decode_len"], "ignore_eos": True, "cache_prompt": False}
        dec = server.post("/completion", body)["timings"]
        rss = psutil.Process(server.proc.pid).memory_info().rss / 2**20
    finally:
        server.stop()
    return {
        "load_s": load_s,
        "first_prefill_s": first["prompt_ms"] / 1000.0,
        "prefill_tok_s": pre["prompt_per_second"],
        "decode_tok_s": dec["predicted_per_second"],
        "rss_mib": rss,
        "kernels": "llama-server",
    }


def run(args: argparse.Namespace) -> int:
    shape = GptOssShape(
        args.layers, args.d, args.heads, args.kv_heads, 64, args.ffn, args.experts, args.top_k, args.vocab
    )
    log(f"synthetic gpt-oss {shape.tag} (MXFP4 experts) ...")
    path = synthetic_gptoss(shape, folder=args.cache_dir)
    log("measuring memory bandwidth ...")
    bw = bandwidth_gbs()
    spec = {"model": str(path), "prompt_len": args.prompt_len, "decode_len": args.decode_len, "vocab": shape.vocab}
    out, load_before = Path(args.out), os.getloadavg()
    log("agentkv ...")
    results = {
        "agentkv": run_isolated("agentkv.bench.gptoss:agentkv_worker", spec, out / "runs", "agentkv", args.arm_timeout)
    }
    log("llama-server ...")
    from agentkv.bench.llama_server import default_server_binary

    binary = Path(args.llama_server) if args.llama_server else default_server_binary()
    try:
        results["llama-server"] = llama_server_arm(spec, binary, out / "runs" / "llama-server", args.arm_timeout)
    except (OSError, RuntimeError, ValueError, KeyError) as exc:
        results["llama-server"] = {"error": f"llama-server {binary}: {exc}"}
    facts = decode_bytes(path, shape.top_k)
    file_mib = path.stat().st_size / 2**20
    ok = {a: r for a, r in results.items() if not failed(r)}
    vs = {k: ok["agentkv"][k] / ok["llama-server"][k] for k in SPEEDS} if {"agentkv", "llama-server"} <= set(ok) else {}
    payload = envelope(
        "gptoss",
        model=str(path),
        shape=asdict(shape),
        file_mib=file_mib,
        gguf=facts,
        threads=peers.THREADS,
        bandwidth=bw,
        decode_ceiling_tok_s=bw["best_gbs"] * 1e9 / facts["decode_bytes_per_token"],
        rss_over_file={a: r["rss_mib"] / file_mib for a, r in ok.items()},
        load_average_before=load_before,
        load_average_after=os.getloadavg(),
        results=results,
        ratios={"vs_llama_server": vs},
        targets={"speed_vs_llama_server": SPEED_TARGET, "rss_over_file": 1.1},
        speed_verdict=verdict(vs) if vs else "not measured",
    )
    md = markdown(payload)
    groups = {k: {a: r.get(k) for a, r in ok.items()} for k in SPEEDS}
    png = bar_plot(out / "gptoss.png", f"synthetic gpt-oss-20b shapes, MXFP4, {peers.THREADS} threads", groups, "tok/s")
    if png:
        md.append(f"\n![gptoss]({png.name})")
    print_paths({**write_outputs(out, "gptoss", payload, md), **({"png": png} if png else {})})
    return 0


def markdown(payload: dict) -> list[str]:
    bw, g = payload["bandwidth"], payload["gguf"]
    lines = [
        f"model: synthetic gpt-oss {payload['shape']}, GGUF {payload['file_mib'] / 1024:.2f} GiB; decode reads "
        f"{g['decode_bytes_per_token'] / 2**20:.0f} MiB per token -> ceiling {payload['decode_ceiling_tok_s']:.1f} "
        f"tok/s at {bw['best_gbs']:.1f} GB/s; load average before {payload['load_average_before'][0]:.1f}, after "
        f"{payload['load_average_after'][0]:.1f}; {payload['threads']} threads per engine; one run each",
        "",
    ]
    rows = []
    for arm, r in payload["results"].items():
        if failed(r):
            rows.append([arm, "—", "—", "—", "—", "—", "—", why(r)])
        else:
            of_ceiling = r["decode_tok_s"] / payload["decode_ceiling_tok_s"]
            rss = r["rss_mib"] / payload["file_mib"]
            first = r.get("first_prefill_s", float("nan"))
            rows.append([arm, r["load_s"], first, rss, r["prefill_tok_s"], r["decode_tok_s"], of_ceiling, r["kernels"]])
    head = ["engine", "load s", "first prefill s", "RSS / file", "prefill tok/s", "decode tok/s", "of ceiling"]
    lines += table([*head, "kernels"], rows)
    lines += [
        "",
        "The first prefill (a different prompt) pages the experts in and is reported, not timed in the ratios; "
        "prefill and decode are the runs after it.",
    ]
    vs = payload["ratios"]["vs_llama_server"]
    if vs:
        lines += [
            "",
            f"- agentkv ÷ llama-server: prefill ×{vs['prefill_tok_s']:.2f}, decode ×{vs['decode_tok_s']:.2f} "
            f"(target {SPEED_TARGET}×: {payload['speed_verdict']})",
        ]
    return lines

"""`agentkv bench moe`: single-stream decode and prefill of a mixture-of-experts model vs
llama.cpp on the same GGUF, in one run, each arm in a fresh process with THREADS threads.

The model is synthetic (bench/moe_model.py): OLMoE's layer layout scaled to ~1B weights, random
weights, quantized, built once into a cache folder. Against the speeds: the decode bandwidth
ceiling, the bytes one decode token must read (every dense weight once, the output head, one
embedding row, and only the top-k experts of each layer) over the memory bandwidth measured in
this run. Target: agentkv >= 1.5x llama.cpp on prefill and decode (below 1.0x: not done).
"""

from __future__ import annotations

import argparse
import os
from dataclasses import asdict
from pathlib import Path

from agentkv.bench import peers
from agentkv.bench.common import bar_plot, envelope, log, print_paths, table, write_outputs
from agentkv.bench.forward import SPEEDS, add_speed_flags, ratios, run_arms
from agentkv.bench.isolate import failed, why
from agentkv.bench.moe_model import QTYPES, MoEShape, synthetic_moe
from agentkv.bench.quant import SPEED_FLOOR, SPEED_TARGET, bandwidth_gbs

ARMS = ("agentkv", "llamacpp")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    defaults = MoEShape()
    parser.add_argument("--qtype", default="Q8_0", choices=QTYPES, help="the model's quant type (default Q8_0)")
    for name in ("layers", "experts", "top_k", "d", "ffn", "heads", "vocab"):
        parser.add_argument(f"--{name.replace('_', '-')}", type=int, default=getattr(defaults, name))
    parser.add_argument("--arms", default=",".join(ARMS), help=f"comma list of {', '.join(ARMS)}")
    parser.add_argument("--cache-dir", default=None, help="where the synthetic GGUF is kept (default ~/.cache)")
    add_speed_flags(parser)
    parser.set_defaults(decode_len=64, repeats=2)
    parser.add_argument("--out", default="bench/out")


def decode_bytes(path: Path, top_k: int) -> dict:
    """GGUF tensor bytes, and the bytes one decode token reads: dense tensors whole, one row of
    token_embd (all of it when the head is tied to it: no output.weight), top_k of each layer's
    experts."""
    import gguf

    reader = gguf.GGUFReader(str(path))
    total = experts = per_token = 0
    tied = not any(t.name == "output.weight" for t in reader.tensors)  # the head reads token_embd whole
    for t in reader.tensors:
        n = int(t.n_bytes)
        total += n
        if "_exps." in t.name:
            experts += n
            per_token += n * top_k // int(t.shape[-1])  # gguf-py lists dims innermost first
        elif t.name == "token_embd.weight" and not tied:
            per_token += n // int(t.shape[-1])
        else:
            per_token += n
    return {"tensor_bytes": total, "expert_bytes": experts, "decode_bytes_per_token": per_token}


def verdict(vs: dict) -> str:
    worst = min(vs.values())
    return "met" if worst >= SPEED_TARGET else "missed (>= 1.0x)" if worst >= SPEED_FLOOR else "missed (< 1.0x)"


def run(args: argparse.Namespace) -> int:
    arms = [a for a in args.arms.split(",") if a]
    for bad in [a for a in arms if a not in ARMS]:
        raise ValueError(f"--arms: unknown arm {bad!r}; choose from {', '.join(ARMS)}")
    shape = MoEShape(args.layers, args.d, args.heads, args.ffn, args.experts, args.top_k, args.vocab)
    log(f"synthetic MoE {shape.tag} {args.qtype} ...")
    path = synthetic_moe(shape, args.qtype, folder=args.cache_dir)
    log("measuring memory bandwidth ...")
    bw = bandwidth_gbs()
    base = {"model": str(path), "backend": "cpu", "weights": "resident"}
    base |= {"prompt_len": args.prompt_len, "decode_len": args.decode_len, "repeats": args.repeats}
    load_before = os.getloadavg()
    out = Path(args.out)
    results = run_arms("agentkv.bench.forward:worker", {a: {**base, "arm": a} for a in arms}, out, args.arm_timeout)
    facts = decode_bytes(path, shape.top_k)
    ceiling = bw["best_gbs"] * 1e9 / facts["decode_bytes_per_token"]
    payload = envelope(
        "moe",
        **base,
        qtype=args.qtype,
        shape=asdict(shape),
        weights_count=shape.counts(),
        gguf=facts,
        threads=peers.THREADS,
        bandwidth=bw,
        decode_ceiling_tok_s=ceiling,
        llamacpp_build=peers.llamacpp_build(),
        load_average_before=load_before,
        load_average_after=os.getloadavg(),
        results=results,
        ratios=ratios(results),
        targets={"speed_vs_llamacpp": SPEED_TARGET},
    )
    vs = payload["ratios"].get("vs_llamacpp")
    if vs:
        payload["speed_verdict"] = verdict(vs)
    md = markdown(payload)
    groups = {k: {a: r.get(k) for a, r in results.items() if not failed(r)} for k in SPEEDS}
    png = bar_plot(
        out / "moe.png", f"synthetic OLMoE {shape.tag} {args.qtype}, {peers.THREADS} threads", groups, "tok/s"
    )
    if png:
        md.append(f"\n![moe]({png.name})")
    paths = write_outputs(out, "moe", payload, md)
    print_paths({**paths, **({"png": png} if png else {})})
    return 0


def markdown(payload: dict) -> list[str]:
    bw, g, counts = payload["bandwidth"], payload["gguf"], payload["weights_count"]
    lines = [
        f"model: synthetic OLMoE layout {payload['shape']}, {payload['qtype']}, "
        f"{counts['total'] / 1e9:.2f}B weights ({counts['active_per_token'] / 1e9:.2f}B active per token), "
        f"GGUF tensors {g['tensor_bytes'] / 2**20:.0f} MiB",
        "",
        f"memory bandwidth {bw['best_gbs']:.1f} GB/s best; decode reads {g['decode_bytes_per_token'] / 2**20:.0f} "
        f"MiB per token (active experts only) -> ceiling {payload['decode_ceiling_tok_s']:.1f} tok/s; load "
        f"average before {payload['load_average_before'][0]:.1f}, after {payload['load_average_after'][0]:.1f}; "
        f"{payload['threads']} threads per engine",
        "",
    ]
    rows = []
    for arm, r in payload["results"].items():
        if failed(r):
            rows.append([arm, "—", "—", "—", why(r)])
        else:
            of_ceiling = r["decode_tok_s"] / payload["decode_ceiling_tok_s"]
            kernels = r.get("kernels", "").replace("|", "/")  # llama.cpp's system info line has pipes
            rows.append([arm, r["prefill_tok_s"], r["decode_tok_s"], of_ceiling, kernels])
    lines += table(["engine", "prefill tok/s", "decode tok/s", "decode of ceiling", "kernels / status"], rows)
    vs = payload["ratios"].get("vs_llamacpp")
    if vs:
        lines += [
            "",
            f"- agentkv ÷ llama.cpp: prefill ×{vs['prefill_tok_s']:.2f}, decode ×{vs['decode_tok_s']:.2f} "
            f"(target {SPEED_TARGET}×: {payload['speed_verdict']})",
        ]
    return lines

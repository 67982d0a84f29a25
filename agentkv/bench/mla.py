"""`agentkv bench mla`: a synthetic GGUF with DeepSeek-V2-Lite's shapes (bench/mla_model.py: MLA
with a 512-wide latent, 64 experts top-6 plus 2 shared, Q4_K experts, random weights, ~9 GiB,
written once into the cache folder) on agentkv and on llama.cpp's own `llama-server`, same
file, THREADS threads each, one run each (bench/synthetic_arms.py): resident memory against
the file, a 512-token prefill, single-stream decode, decode after an 8K-token prompt, and the
KV bytes per token of both engines. Target >= 1.5x llama.cpp on prefill and decode; below 1.0x
the issue is not done. The machine is shared: figures are ratios within one run, with the
load average before and after."""

from __future__ import annotations

import argparse
from pathlib import Path

from agentkv.bench import peers
from agentkv.bench.common import log, table
from agentkv.bench.isolate import failed, why
from agentkv.bench.mla_model import V2LiteShape, synthetic_v2lite
from agentkv.bench.quant import SPEED_TARGET
from agentkv.bench.synthetic_arms import add_run_arguments, arm_ratio_lines, measured_payload, model_line, publish

SPEEDS = ("prefill_tok_s", "decode_tok_s", "long_decode_tok_s")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    defaults = V2LiteShape()
    for name in ("layers", "d", "heads", "kv_rank", "ffn", "dense_ffn", "experts", "top_k", "vocab"):
        parser.add_argument(f"--{name.replace('_', '-')}", type=int, default=getattr(defaults, name))
    parser.add_argument("--prompt-len", type=int, default=512)
    parser.add_argument("--decode-len", type=int, default=128)
    parser.add_argument("--long-len", type=int, default=8192, help="prompt tokens before the long decode (0: none)")
    add_run_arguments(parser, "bench/results/mla", rounds=1)


def run(args: argparse.Namespace) -> int:
    keys = ("layers", "d", "heads", "kv_rank", "ffn", "dense_ffn", "experts", "top_k", "vocab")
    shape = V2LiteShape(**{k: getattr(args, k) for k in keys})
    log(f"synthetic DeepSeek-V2-Lite {shape.tag} (Q4_K experts) ...")
    path = synthetic_v2lite(shape, folder=args.cache_dir)
    payload = measured_payload("mla", shape, path, args, SPEEDS)
    publish(
        payload,
        markdown(payload),
        f"synthetic DeepSeek-V2-Lite shapes, {peers.THREADS} threads",
        SPEEDS,
        Path(args.out),
    )
    return 0


def markdown(payload: dict) -> list[str]:
    lines = [model_line(payload, "DeepSeek-V2-Lite"), ""]
    rows = []
    for arm, r in payload["results"].items():
        if failed(r):
            rows.append([arm, *["—"] * 8, why(r)])
            continue
        rss = r["rss_mib"] / payload["file_mib"]
        kv = r.get("kv_bytes_per_token")
        speeds = [r.get(k, float("nan")) for k in ("prefill_tok_s", "decode_tok_s", "long_prefill_tok_s")]
        rows.append([arm, r["load_s"], r["first_prefill_s"], rss, *speeds, r.get("long_decode_tok_s", float("nan"))])
        rows[-1] += ["—" if kv is None else f"{kv:,.0f}", r["kernels"]]
    head = ["engine", "load s", "first prefill s", "RSS / file", "prefill tok/s", "decode tok/s"]
    head += ["long prefill tok/s", "long decode tok/s", "KV bytes/token", "kernels"]
    lines += table(head, rows)
    vs = payload["ratios"]["vs_llama_server"]
    lines += [
        "",
        "The first prefill (another prompt) pages the weights in and is not in the ratios. The long decode "
        "follows a prompt of --long-len tokens. agentkv's KV bytes per token are its cache dtype's "
        "(latent + rope key per layer); llama-server's come from its `llama_kv_cache: size` log line.",
    ]
    if vs:
        ratio = ", ".join(f"{k.replace('_tok_s', '')} ×{v:.2f}" for k, v in vs.items())
        lines += ["", f"- agentkv ÷ llama-server: {ratio} (target {SPEED_TARGET}×: {payload['speed_verdict']})"]
    return lines + arm_ratio_lines(payload, SPEEDS)

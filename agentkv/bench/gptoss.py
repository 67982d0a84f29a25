"""`agentkv bench gptoss`: a synthetic GGUF with gpt-oss-20b's shapes (bench/gptoss_model.py,
MXFP4 experts, random weights, ~12 GiB, written once into the cache folder) on agentkv and on
llama.cpp's own `llama-server`, same file, THREADS threads each, the arms taking turns for
--rounds rounds (default 3: this machine's memory bandwidth drifts by a third from minute to
minute, and decode is bandwidth-bound on both engines; figures are each arm's medians): load time,
resident memory against the file size (target <= 1.1x), a 512-token prefill and single-stream
decode, and decode against the bandwidth ceiling of the bytes one token reads (dense tensors,
one embedding row, the top-4 experts of each layer). Target >= 1.5x llama.cpp on prefill and
decode; below 1.0x the issue is not done. The machine is shared: figures are ratios within one
run, with the load average before and after."""

from __future__ import annotations

import argparse
from pathlib import Path

from agentkv.bench import peers
from agentkv.bench.common import log, table
from agentkv.bench.gptoss_model import GptOssShape, synthetic_gptoss
from agentkv.bench.isolate import failed, why
from agentkv.bench.quant import SPEED_TARGET
from agentkv.bench.synthetic_arms import add_run_arguments, arm_ratio_lines, measured_payload, model_line, publish

SPEEDS = ("prefill_tok_s", "decode_tok_s")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    defaults = GptOssShape()
    for name in ("layers", "experts", "top_k", "d", "ffn", "heads", "kv_heads", "vocab"):
        parser.add_argument(f"--{name.replace('_', '-')}", type=int, default=getattr(defaults, name))
    parser.add_argument("--prompt-len", type=int, default=512)
    parser.add_argument("--decode-len", type=int, default=128)
    add_run_arguments(parser, "bench/results/gptoss", rounds=3, timeout_s=1800.0)


def run(args: argparse.Namespace) -> int:
    shape = GptOssShape(
        args.layers, args.d, args.heads, args.kv_heads, 64, args.ffn, args.experts, args.top_k, args.vocab
    )
    log(f"synthetic gpt-oss {shape.tag} (MXFP4 experts) ...")
    path = synthetic_gptoss(shape, folder=args.cache_dir)
    payload = measured_payload("gptoss", shape, path, args, SPEEDS)
    publish(
        payload,
        markdown(payload),
        f"synthetic gpt-oss-20b shapes, MXFP4, {peers.THREADS} threads",
        SPEEDS,
        Path(args.out),
    )
    return 0


def markdown(payload: dict) -> list[str]:
    lines = [model_line(payload, "gpt-oss"), ""]
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
    return lines + arm_ratio_lines(payload, SPEEDS)

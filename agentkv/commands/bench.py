"""`agentkv bench SUITE`: the benchmarks against peers, one module per suite in agentkv.bench
(each with add_arguments(parser) and run(args) -> exit code); JSON, Markdown and PNG output.

Peers come from the `bench` extra (`make bench` builds llama-cpp-python for this CPU); a
peer that is not installed is reported as skipped, never as a pass.
"""

from __future__ import annotations

import argparse
import importlib
import sys

SUITES: dict[str, tuple[str, str]] = {
    "agents": ("agentkv.bench.agents", "agent workloads on agentkv and its peers"),
    "forward": ("agentkv.bench.forward", "single-stream prefill/decode speed vs the peers"),
    "quant": ("agentkv.bench.quant", "resident quantized weights vs llama.cpp: speed, memory, profile"),
    "moe": ("agentkv.bench.moe", "a synthetic ~1B mixture-of-experts GGUF vs llama.cpp: decode, prefill, ceiling"),
    "gptoss": ("agentkv.bench.gptoss", "a synthetic GGUF with gpt-oss-20b's shapes vs llama-server: load, RSS, speed"),
    "mla": ("agentkv.bench.mla", "a synthetic DeepSeek-V2-Lite-shaped GGUF (MLA) vs llama-server: RSS, speed, KV"),
    "hybrid": (
        "agentkv.bench.hybrid",
        "a synthetic Qwen3.5-0.8B-shaped GGUF (gated DeltaNet hybrid) vs llama-server: speed, 2nd-turn TTFT",
    ),
    "cache": ("agentkv.bench.cache", "prefix-cache reuse: agentkv with the cache on vs off"),
    "disk": ("agentkv.bench.disk", "TTFT after a restart: cold, warm from the disk tier, llama.cpp slot restore"),
    "kernels": ("agentkv.bench.kernels", "the compiled CPU kernels vs torch on model shapes"),
    "load": ("agentkv.bench.load", "concurrent streaming clients against a local server"),
    "spec": ("agentkv.bench.spec", "speculative decoding on copy-heavy and open-ended turns"),
    "cluster": ("agentkv.bench.cluster", "1, 2, 3 workers behind sglang-router: throughput, hit ratio"),
    "soak": ("agentkv.bench.soak", "mixed traffic for a fixed time: RSS flat, no 5xx, no leaked block, exact answers"),
    "stepcost": ("agentkv.bench.stepcost", "Python time per engine step with a small and a huge prefix cache"),
    "lora": ("agentkv.bench.lora", "8 LoRA adapters mixed in one batch vs the base alone: prefill, decode"),
    "long": ("agentkv.bench.long", "long contexts and agent loops over HTTP vs llama_cpp.server: replay, TTFT, decode"),
    "rerank": (
        "agentkv.bench.rerank",
        "1 query x N documents, Qwen3-Reranker-0.6B shapes: prefix reuse on vs llama-server",
    ),
    "tools": ("agentkv.bench.tools", "BFCL simple/multiple/parallel tool-call accuracy vs llama-server --jinja"),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="suite", required=True, metavar="SUITE")
    for name, (module_name, help_text) in SUITES.items():
        sp = sub.add_parser(name, help=help_text, description=help_text)
        sp.set_defaults(_suite=module_name)
        # Like the top-level parser: only the chosen suite's module is imported.
        if name in sys.argv[2:3]:
            importlib.import_module(module_name).add_arguments(sp)


def run(args: argparse.Namespace) -> int:
    try:
        return int(importlib.import_module(args._suite).run(args) or 0)
    except ValueError as exc:
        print(f"agentkv bench {args.suite}: {exc}", file=sys.stderr)
        return 2

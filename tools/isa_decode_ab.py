"""A/B of the two kernel ISAs on one decode step's matmuls, interleaved in one process (the
cores are shared, so only the ratio measured in the same run means anything): every linear
weight of SmolLM2 (or random weights of its shapes) once at m rows, avx2 and avx512 taking
turns via override_isa_unchecked, best-of per round; prints ms per sweep per ISA and the
ratio. Usage: python tools/isa_decode_ab.py [--threads 2] [--rounds 7] [--m 1]"""

from __future__ import annotations

import argparse
import statistics
import time


def main() -> None:
    import torch

    from agentkv.bench.kernels import load_weights
    from agentkv.hal.kernels import load

    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--m", type=int, default=1)
    ap.add_argument("--qtype", type=int, default=None, help="only weights of this qtype")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    K = load()
    weights, source = load_weights()
    mats = [(w, qt, n, k, torch.randn(args.m, k)) for w, qt, n, k in weights.values()]
    if args.qtype is not None:
        mats = [m for m in mats if m[1] == args.qtype]
    isas = [i for i in ("avx2", "avx512") if K.isa_supported(i)]
    times: dict[str, list[float]] = {i: [] for i in isas}
    nbytes = sum(w.numel() for w, *_ in mats)
    for _ in range(args.rounds):
        for isa in isas:
            K.override_isa_unchecked(isa)
            best = float("inf")
            for _ in range(5):
                t0 = time.perf_counter()
                for w, qt, n, k, x in mats:
                    K.qmatmul(x, w, qt, n, k)
                best = min(best, time.perf_counter() - t0)
            times[isa].append(best)
    print(f"{source}; {len(mats)} matrices, {nbytes / 1e6:.1f} MB; m={args.m}; {args.threads} threads")
    for isa in isas:
        med = statistics.median(times[isa])
        print(f"  {isa:7s} median {med * 1e3:7.3f} ms/sweep  {nbytes / med / 1e9:6.1f} GB/s")
    if len(isas) == 2:
        print(
            f"  avx2 / avx512 time ratio: {statistics.median(times['avx2']) / statistics.median(times['avx512']):.3f}"
        )


if __name__ == "__main__":
    main()

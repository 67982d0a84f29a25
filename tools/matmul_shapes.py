"""Each distinct one-row matmul of a model, timed hot: `python tools/matmul_shapes.py [MODEL]
[--threads 1] [--int8] [--ghz 3.56]` (run from the checkout with `PYTHONPATH` pointing at it).
For every (projection, qtype, shape) of the model's layers it calls the kernels' qmatmul on one
random row, 5 x 100 times after a warm-up, and prints the best per-call time, the cycles per 32
weights at --ghz, and how many layers carry that matmul. Old and new builds are compared by
running it from two worktrees in turn (each checkout builds its own kernels)."""

from __future__ import annotations

import argparse
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("model", nargs="?", default="smollm2")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--int8", action="store_true", help="int8 activations")
    parser.add_argument("--ghz", type=float, default=3.56, help="core clock for the cycle figures")
    args = parser.parse_args()
    import torch

    from agentkv.hal.kernels import load
    from agentkv.runtime.config import engine_config
    from agentkv.runtime.engine import Engine

    kernels = load()
    config = engine_config(args.model, enable_prefix_cache=False, kv_cache_blocks=8, max_model_len=64)
    model = Engine(config).runner.model
    seen: dict[tuple, list] = {}
    for layer in model.layers:
        for name, w in (
            ("qkv", layer.attention.qkv.weights[0]),
            ("o", layer.attention.o),
            ("gate_up", layer.ffn.gate_up.weights[0]),
            ("down", layer.ffn.down),
        ):
            seen.setdefault((name, w.qtype, tuple(w.shape)), [0, w])[0] += 1
    torch.set_num_threads(args.threads)
    total = 0.0
    for (name, qtype, shape), (count, w) in seen.items():
        x = torch.randn(1, w.shape[1])
        for _ in range(50):
            kernels.qmatmul(x, w.raw, w.qtype, w.shape[0], w.shape[1], args.int8)
        times = []
        for _ in range(5):
            t0 = time.perf_counter()
            for _ in range(100):
                kernels.qmatmul(x, w.raw, w.qtype, w.shape[0], w.shape[1], args.int8)
            times.append((time.perf_counter() - t0) / 100)
        best = min(times)
        total += best * count
        cycles = best * args.ghz * 1e9 * args.threads / (shape[0] * shape[1] / 32)
        where = f"{name:8s} qtype {qtype:2d} {str(shape):14s} x{count:2d}"
        print(f"{where}  {best * 1e6:7.1f} us  {cycles:5.2f} cycles/32w")
    print(f"{args.model}: all layers' one-row matmuls, hot, {args.threads} thread(s): {total * 1e3:.2f} ms")


if __name__ == "__main__":
    main()

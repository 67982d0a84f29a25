"""Where one decode step's time goes, in process: `python tools/decode_parts.py [MODEL]
[--depth 256] [--steps 40] [--activation-dtype int8]` (run from the checkout with `PYTHONPATH` pointing at it). On one
and on two kernel threads it times the whole step at DEPTH (a store of zeroed slots: attention
costs the same whatever the values), then the same step's layer matmuls alone (every
projection weight, one row, in model order) and the head alone; the rest is attention, norms,
glue and Python. Prints 20th percentiles, so a busy moment of a shared machine falls out."""

from __future__ import annotations

import argparse
import time


def p20(times: list[float]) -> float:
    return 1e3 * sorted(times)[len(times) // 5]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("model", nargs="?", default="smollm2")
    parser.add_argument("--depth", type=int, default=256)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--activation-dtype", choices=("f32", "int8"), default="f32")
    args = parser.parse_args()
    import torch

    from agentkv.hal.kernels import load
    from agentkv.runtime.config import engine_config
    from agentkv.runtime.engine import Engine
    from agentkv.runtime.runner import Chunk

    kernels = load()
    blocks = args.depth // 16 + 2
    config = engine_config(
        args.model,
        enable_prefix_cache=False,
        kv_cache_blocks=blocks + 2,
        max_model_len=args.depth + 32,
        activation_dtype=args.activation_dtype,
    )
    int8 = args.activation_dtype == "int8"
    runner = Engine(config).runner
    model = runner.model
    chunk = Chunk([100], args.depth, list(range(blocks)), "last")
    weights = [
        w
        for layer in model.layers
        for w in (*layer.attention.qkv.weights, layer.attention.o, *layer.ffn.gate_up.weights, layer.ffn.down)
    ]
    xs = {w.shape[1]: torch.randn(1, w.shape[1]) for w in weights}
    head = model.head
    head_x = torch.randn(1, head.shape[1])
    layer_mb = sum(w.raw.numel() for w in weights) / 1e6
    for threads in (1, 2):
        torch.set_num_threads(threads)
        step, mm, hd = [], [], []
        for _ in range(args.steps):
            t0 = time.perf_counter()
            runner.run([chunk])
            step.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            for w in weights:
                kernels.qmatmul(xs[w.shape[1]], w.raw, w.qtype, w.shape[0], w.shape[1], int8)
            mm.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            kernels.qmatmul(head_x, head.raw, head.qtype, head.shape[0], head.shape[1], int8)
            hd.append(time.perf_counter() - t0)
        print(
            f"{args.model} {args.activation_dtype} depth {args.depth}, {threads} thread(s): "
            f"step {p20(step):.2f} ms; layer matmuls "
            f"{p20(mm):.2f} ms ({layer_mb:.1f} MB, {layer_mb / p20(mm):.1f} GB/s); head {p20(hd):.2f} ms; "
            f"the rest {p20(step) - p20(mm) - p20(hd):.2f} ms",
            flush=True,
        )


if __name__ == "__main__":
    main()

"""The paged-attention kernel alone on the last prefill chunk of a long prompt: `rows` query
rows of one sequence at positions depth - rows .. depth - 1 over random K/V, timed with the
model's head shapes: `python tools/attention_depth.py 8192 [--rows 512] [--kv-cache-dtype f16]
[--shape 9,3,64] [--window 0]` (run from the checkout, with `PYTHONPATH` pointing at it).
Prints the best and the median of --reps calls."""

from __future__ import annotations

import argparse
import time

BLOCK_SIZE = 16


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("depth", type=int, help="keys of the last row (its position + 1)")
    parser.add_argument("--rows", type=int, default=512, help="query rows: the chunk")
    parser.add_argument("--kv-cache-dtype", default="f32", choices=("f32", "f16"))
    parser.add_argument("--shape", default="9,3,64", help="heads,kv_heads,head_dim (default SmolLM2's)")
    parser.add_argument("--window", type=int, default=0, help="sliding window (0: none)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    h, kvh, hd = (int(x) for x in args.shape.split(","))
    if not 0 < args.rows <= args.depth:
        raise SystemExit(f"--rows {args.rows} must be in 1 .. depth ({args.depth})")
    import torch

    from agentkv.hal.kernels import load

    kernels = load()
    torch.set_num_threads(args.threads)
    g = torch.Generator().manual_seed(0)
    num_blocks = -(-args.depth // BLOCK_SIZE)
    k = torch.randn(num_blocks, BLOCK_SIZE, kvh, hd, generator=g)
    v = torch.randn(num_blocks, BLOCK_SIZE, kvh, hd, generator=g)
    if args.kv_cache_dtype == "f16":
        k, v = k.half(), v.half()
    table = torch.arange(num_blocks, dtype=torch.int32)[None]
    q = torch.randn(args.rows, h, hd, generator=g)
    seq = torch.zeros(args.rows, dtype=torch.int32)
    pos = torch.arange(args.depth - args.rows, args.depth, dtype=torch.int32)
    kernels.paged_attention(q, k, v, table, seq, pos, hd**-0.5, args.window)
    times = []
    for _ in range(args.reps):
        t0 = time.perf_counter()
        kernels.paged_attention(q, k, v, table, seq, pos, hd**-0.5, args.window)
        times.append(time.perf_counter() - t0)
    times.sort()
    print(
        f"depth={args.depth} rows={args.rows} shape={h},{kvh},{hd} kv={args.kv_cache_dtype} window={args.window} "
        f"isa={kernels.isa()} threads={args.threads}: best {1e3 * times[0]:.1f} ms, "
        f"median {1e3 * times[len(times) // 2]:.1f} ms"
    )


if __name__ == "__main__":
    main()

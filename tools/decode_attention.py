"""Decode attention as a decode step meets it: one query row for each of --rows sequences at
`depth` tokens, every layer's f16 K/V its own (30 SmolLM2-sized layers of 2,912 blocks, more
than the L3 holds), the layers called in turn as the decoder stack calls them:
`python tools/decode_attention.py 2048 [--rows 5] [--shape 9,3,64] [--library path.so]`
(run from the checkout, with `PYTHONPATH` pointing at it). --library loads another build of
the kernel library (a copy of the cached agentkv_cpu_kernels.so) to compare two in turn;
AGENTKV_CPU_ISA=avx2 picks that build. Prints the 20th-percentile time per layer."""

from __future__ import annotations

import argparse
import importlib.util
import os
import time

BLOCKS, BLOCK_SIZE = 2912, 16


def kernels(library: str | None):
    if library is None:
        from agentkv.hal.kernels import load

        return load()
    import torch  # noqa: F401 — the library links against it

    spec = importlib.util.spec_from_file_location("agentkv_cpu_kernels", library)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if os.environ.get("AGENTKV_CPU_ISA"):
        module.set_isa(os.environ["AGENTKV_CPU_ISA"])
    return module


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("depth", type=int, help="keys each row attends (its position + 1)")
    parser.add_argument("--rows", type=int, default=1, help="decode rows, one sequence each")
    parser.add_argument("--shape", default="9,3,64", help="heads,kv_heads,head_dim (default SmolLM2's)")
    parser.add_argument("--layers", type=int, default=30)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--library", help="a built kernel library to load instead of the cached one")
    args = parser.parse_args()
    h, kvh, hd = (int(x) for x in args.shape.split(","))
    per_seq = BLOCKS // args.rows
    if args.depth > per_seq * BLOCK_SIZE:
        raise SystemExit(f"depth {args.depth} needs more than the {per_seq} blocks each of {args.rows} rows has")
    import torch

    k = kernels(args.library)
    torch.set_num_threads(2)
    shape = (args.layers, BLOCKS, BLOCK_SIZE, kvh, hd)
    keys, values = torch.randn(shape).half(), torch.randn(shape).half()
    q = torch.randn(args.rows, h, hd)
    tables = torch.arange(per_seq * args.rows, dtype=torch.int32).reshape(args.rows, per_seq)
    row_seq = torch.arange(args.rows, dtype=torch.int32)
    row_pos = torch.full((args.rows,), args.depth - 1, dtype=torch.int32)

    def step() -> None:
        for layer in range(args.layers):
            k.paged_attention(q, keys[layer], values[layer], tables, row_seq, row_pos, hd**-0.5, 0, 0.0, None)

    for _ in range(3):
        step()
    times = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    per_layer = sorted(times)[len(times) // 5] / args.layers
    print(f"depth {args.depth}, {args.rows} row(s), shape {args.shape}: {per_layer * 1e6:.1f} us per layer", flush=True)


if __name__ == "__main__":
    main()

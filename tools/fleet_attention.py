"""One decode step's attention for a fleet of agents on one system prompt: `--seqs` sequences
whose first `--prefix` keys are the same cached blocks, each with its own `--tail` keys after
them, one decode row each, through `--layers` layers' K/V (separate tensors, so the step reads
what a model's would, not one layer's from cache): `python tools/fleet_attention.py [--seqs 5]
[--prefix 2048] [--tail 900] [--kv-cache-dtype f16] [--copied]` (run from the checkout, with
`PYTHONPATH` pointing at it). `--copied` gives every sequence its own copy of the prefix blocks
(the same values in other blocks: the same bits, no sharing). Prints the best and the median
step of --reps."""

from __future__ import annotations

import argparse
import time

BLOCK_SIZE = 16


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seqs", type=int, default=5)
    parser.add_argument("--prefix", type=int, default=2048, help="shared keys (a multiple of the block size)")
    parser.add_argument("--tail", type=int, default=900, help="each sequence's own keys after the prefix")
    parser.add_argument("--layers", type=int, default=30)
    parser.add_argument("--kv-cache-dtype", default="f16", choices=("f32", "f16"))
    parser.add_argument("--shape", default="9,3,64", help="heads,kv_heads,head_dim (default SmolLM2's)")
    parser.add_argument("--copied", action="store_true", help="each sequence its own copy of the prefix blocks")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--reps", type=int, default=20)
    args = parser.parse_args()
    h, kvh, hd = (int(x) for x in args.shape.split(","))
    if args.prefix % BLOCK_SIZE:
        raise SystemExit(f"--prefix {args.prefix} must be a multiple of {BLOCK_SIZE}")
    import torch

    from agentkv.hal.kernels import load

    kernels = load()
    torch.set_num_threads(args.threads)
    g = torch.Generator().manual_seed(0)
    shared, own = args.prefix // BLOCK_SIZE, -(-args.tail // BLOCK_SIZE)
    num_blocks = shared + own * args.seqs
    tables = torch.zeros(args.seqs, shared + own, dtype=torch.int32)
    for s in range(args.seqs):
        tables[s, :shared] = torch.arange(shared) + (num_blocks + (s - 1) * shared if args.copied and s else 0)
        tables[s, shared:] = shared + s * own + torch.arange(own)
    dtype = torch.float16 if args.kv_cache_dtype == "f16" else torch.float32
    layers = []
    for _ in range(args.layers):
        k = torch.randn(num_blocks, BLOCK_SIZE, kvh, hd, generator=g).to(dtype)
        v = torch.randn(num_blocks, BLOCK_SIZE, kvh, hd, generator=g).to(dtype)
        if args.copied:  # the other sequences' copies of the prefix blocks, after the blocks
            k = torch.cat([k, k[:shared].repeat(args.seqs - 1, 1, 1, 1)])
            v = torch.cat([v, v[:shared].repeat(args.seqs - 1, 1, 1, 1)])
        layers.append((k, v))
    q = torch.randn(args.seqs, h, hd, generator=g)
    seq = torch.arange(args.seqs, dtype=torch.int32)
    pos = torch.full((args.seqs,), args.prefix + args.tail - 1, dtype=torch.int32)
    pos -= torch.arange(args.seqs, dtype=torch.int32) * 7  # tails of different lengths

    def step():
        return [kernels.paged_attention(q, k, v, tables, seq, pos, hd**-0.5, 0) for k, v in layers]

    outs = step()
    times = []
    for _ in range(args.reps):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    times.sort()
    digest = float(sum(o.double().sum() for o in outs))
    print(
        f"seqs={args.seqs} prefix={args.prefix} tail={args.tail} layers={args.layers} shape={h},{kvh},{hd} "
        f"kv={args.kv_cache_dtype} {'copied' if args.copied else 'shared'} isa={kernels.isa()} "
        f"threads={args.threads}: best {1e3 * times[0]:.2f} ms, median {1e3 * times[len(times) // 2]:.2f} ms "
        f"(digest {digest!r})"
    )


if __name__ == "__main__":
    main()

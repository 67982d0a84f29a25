"""Decode step time at a context depth, f32 against f16 K/V, without prefilling:
`python tools/decode_depth.py DEPTH [MODEL] [--steps 12]` (run from the checkout with
`PYTHONPATH` pointing at it). Two engines (one per KV dtype) each run one-token steps at
position DEPTH over a store of DEPTH zeroed slots (attention costs the same whatever the
values), alternating step by step so that the machine's load falls on both alike; the first
two steps of each are warm-up. Prints the median and minimum step time."""

from __future__ import annotations

import argparse
import statistics
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("depth", type=int)
    parser.add_argument("model", nargs="?", default="smollm2")
    parser.add_argument("--steps", type=int, default=12)
    args = parser.parse_args()
    import torch

    from agentkv.runtime.config import engine_config
    from agentkv.runtime.engine import Engine
    from agentkv.runtime.runner import Chunk

    torch.set_num_threads(2)
    num_blocks = args.depth // 16 + 2
    runners = {
        dtype: Engine(
            engine_config(
                args.model,
                kv_cache_dtype=dtype,
                enable_prefix_cache=False,
                kv_cache_blocks=num_blocks + 2,
                max_model_len=args.depth + 32,
            )
        ).runner
        for dtype in ("f32", "f16")
    }
    chunk = Chunk([100], args.depth, list(range(num_blocks)), "last")
    times: dict[str, list[float]] = {dtype: [] for dtype in runners}
    for _ in range(args.steps):
        for dtype, runner in runners.items():
            t0 = time.perf_counter()
            runner.run([chunk])
            times[dtype].append(time.perf_counter() - t0)
    for dtype, ts in times.items():
        kv_bytes = runners[dtype].model.kv_spec(1, 16).bytes_per_token
        med = statistics.median(ts[2:])
        print(
            f"{args.model} depth {args.depth} kv={dtype} ({kv_bytes} B/token): decode step median "
            f"{1e3 * med:.1f} ms ({1 / med:.1f} tok/s), min {1e3 * min(ts[2:]):.1f} ms"
        )


if __name__ == "__main__":
    main()

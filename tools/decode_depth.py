"""Decode step time at a context depth for variants of one engine knob, without prefilling:
`python tools/decode_depth.py DEPTH [MODEL] [--steps 12] [--knob kv_cache_dtype --values f32 f16]`
(run from the checkout with `PYTHONPATH` pointing at it; `--knob activation_dtype --values f32
int8` compares the matmul activations). One engine per value each runs one-token steps at
position DEPTH over a store of DEPTH zeroed slots (attention costs the same whatever the
values), alternating step by step so that the machine's load falls on all alike; the first two
steps of each are warm-up. Prints the median and minimum step time."""

from __future__ import annotations

import argparse
import statistics
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("depth", type=int)
    parser.add_argument("model", nargs="?", default="smollm2")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--knob", default="kv_cache_dtype", help="the engine knob the variants differ in")
    parser.add_argument("--values", nargs="+", default=["f32", "f16"])
    args = parser.parse_args()
    import torch

    from agentkv.runtime.config import engine_config
    from agentkv.runtime.engine import Engine
    from agentkv.runtime.runner import Chunk

    torch.set_num_threads(2)
    num_blocks = args.depth // 16 + 2
    runners = {
        value: Engine(
            engine_config(
                args.model,
                enable_prefix_cache=False,
                kv_cache_blocks=num_blocks + 2,
                max_model_len=args.depth + 32,
                **{args.knob: value},
            )
        ).runner
        for value in args.values
    }
    chunk = Chunk([100], args.depth, list(range(num_blocks)), "last")
    times: dict[str, list[float]] = {value: [] for value in runners}
    for _ in range(args.steps):
        for value, runner in runners.items():
            t0 = time.perf_counter()
            runner.run([chunk])
            times[value].append(time.perf_counter() - t0)
    for value, ts in times.items():
        kv_bytes = runners[value].model.kv_spec(1, 16).bytes_per_token
        med = statistics.median(ts[2:])
        print(
            f"{args.model} depth {args.depth} {args.knob}={value} (KV {kv_bytes} B/token): decode step median "
            f"{1e3 * med:.1f} ms ({1 / med:.1f} tok/s), min {1e3 * min(ts[2:]):.1f} ms"
        )


if __name__ == "__main__":
    main()

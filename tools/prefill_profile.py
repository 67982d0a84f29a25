"""Where a prefill's time goes, by function, for any model the engine loads: `python
tools/prefill_profile.py MODEL [--prompt 512] [--activation-dtype auto|f32|int8] [--top 25]` (run
from the checkout with `PYTHONPATH` pointing at it). Loads the model, warms it with a short
prompt, then prefills a fresh random prompt under cProfile; prints its wall time, tokens per
second (with the profiler's small overhead in it: a prefill is a few hundred calls) and the
functions by total time, the compiled kernels among them by name."""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("model")
    parser.add_argument("--prompt", type=int, default=512)
    parser.add_argument("--activation-dtype", choices=("auto", "f32", "int8"), default="auto")
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args()
    import numpy as np

    from agentkv.runtime.config import engine_config
    from agentkv.runtime.engine import Engine
    from agentkv.runtime.params import SamplingParams

    t0 = time.perf_counter()
    engine = Engine(engine_config(args.model, activation_dtype=args.activation_dtype, kv_cache_blocks=256))
    print(f"load {time.perf_counter() - t0:.1f} s, activations {engine.backend.activation_dtype}", flush=True)
    params = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
    rng = np.random.default_rng(1)
    engine.add_request("warm", [int(t) for t in rng.integers(10, 1000, 64)], params)
    while engine.has_unfinished():
        engine.step()
    engine.add_request("timed", [int(t) for t in rng.integers(10, 1000, args.prompt)], params)
    profile = cProfile.Profile()
    t0 = time.perf_counter()
    profile.enable()
    while engine.has_unfinished():
        engine.step()
    profile.disable()
    seconds = time.perf_counter() - t0
    rate = args.prompt / seconds
    print(f"{args.model}: prefill of {args.prompt} tokens {seconds:.2f} s, {rate:.1f} tok/s (profiled)")
    pstats.Stats(profile).sort_stats("tottime").print_stats(args.top)


if __name__ == "__main__":
    main()

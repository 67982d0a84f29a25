"""Where a decode step's time goes, by function, for any model the engine loads (hybrids
included): `python tools/step_profile.py MODEL [--activation-dtype auto|f32|int8] [--prompt 128]
[--steps 64] [--top 30]` (run from the checkout with `PYTHONPATH` pointing at it). Prefills a
random prompt, then decodes under cProfile one step at a time; prints the median step time
(with the profiler's own overhead in it) and the functions by total time."""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("model")
    parser.add_argument("--activation-dtype", choices=("auto", "f32", "int8"), default="auto")
    parser.add_argument("--prompt", type=int, default=128)
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--top", type=int, default=30)
    args = parser.parse_args()
    import numpy as np

    from agentkv.runtime.config import engine_config
    from agentkv.runtime.engine import Engine
    from agentkv.runtime.params import SamplingParams

    config = engine_config(args.model, activation_dtype=args.activation_dtype, kv_cache_blocks=256)
    engine = Engine(config)
    params = SamplingParams(max_tokens=args.steps, temperature=0.0, ignore_eos=True)
    ids = [int(t) for t in np.random.default_rng(0).integers(10, 1000, args.prompt)]
    engine.add_request("warm", ids, params)
    while engine.has_unfinished():
        engine.step()
    engine.add_request("timed", ids[:-8] + [5], params)
    engine.step()  # its prefill, the cached prefix aside
    profile, steps = cProfile.Profile(), []
    while engine.has_unfinished():
        t0 = time.perf_counter()
        profile.enable()
        engine.step()
        profile.disable()
        steps.append(time.perf_counter() - t0)
    print(
        f"{args.model}: activations {engine.backend.activation_dtype}, {len(steps)} decode steps, "
        f"median {1e3 * sorted(steps)[len(steps) // 2]:.2f} ms (profiled)"
    )
    pstats.Stats(profile).sort_stats("tottime").print_stats(args.top)


if __name__ == "__main__":
    main()

"""Where a hybrid model's decode step goes, in process, without a profiler's overhead: `python
tools/hybrid_step_parts.py MODEL [--activation-dtype auto|f32|int8] [--steps 64] [--rounds 3]`
(run from the checkout with `PYTHONPATH` pointing at it). Wraps the backend's ops and the
DeltaNet mixer with wall-clock timers, prefills a 128-token random prompt, decodes `--steps`
tokens per round and prints the median step and each part's ms per step (the parts overlap:
`ffn` holds its matmuls, `delta_net` the fused decode kernel)."""

from __future__ import annotations

import argparse
import collections
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("model")
    parser.add_argument("--activation-dtype", choices=("auto", "f32", "int8"), default="auto")
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    import numpy as np

    import agentkv.models.qwen3next as family
    from agentkv.runtime.config import engine_config
    from agentkv.runtime.engine import Engine
    from agentkv.runtime.params import SamplingParams

    engine = Engine(engine_config(args.model, activation_dtype=args.activation_dtype, kv_cache_blocks=256))
    spent: collections.Counter = collections.Counter()

    def timed(owner, name: str) -> None:
        op = getattr(owner, name)

        def wrapper(*a, **k):
            t0 = time.perf_counter()
            try:
                return op(*a, **k)
            finally:
                spent[name] += time.perf_counter() - t0

        setattr(owner, name, wrapper)

    backend = engine.runner.model.backend
    for name in ("matmul", "matmuls", "delta_net_decode", "attention", "add_norm", "ffn"):
        timed(backend, name)
    timed(family, "delta_net")
    params = SamplingParams(max_tokens=args.steps, temperature=0.0, ignore_eos=True)
    ids = [int(t) for t in np.random.default_rng(0).integers(10, 1000, 128)]
    for r in range(args.rounds):
        engine.add_request(f"round-{r}", ids, params)
        engine.step()  # the prefill (cached after the first round)
        spent.clear()
        steps = []
        while engine.has_unfinished():
            t0 = time.perf_counter()
            engine.step()
            steps.append(time.perf_counter() - t0)
        parts = ", ".join(f"{k} {1e3 * v / len(steps):.2f}" for k, v in spent.items())
        print(f"round {r}: median step {1e3 * float(np.median(steps)):.2f} ms; ms per step: {parts}", flush=True)


if __name__ == "__main__":
    main()

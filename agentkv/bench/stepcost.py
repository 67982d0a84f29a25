"""`agentkv bench stepcost`: the Python time of one engine step (everything but the model run)
with a small and with a huge prefix cache, on a full pool so every new block is an eviction.

The model is a tiny synthetic GGUF (one layer, random weights; `bench/moe_model.py`), so its
KV store holds 60K blocks in a few hundred MB and the kernels take little of a step. The cache
is filled with distinct cached prompts straight through the radix tree (their KV content
does not matter to the bookkeeping). Then `--streams` requests decode and new prompts arrive,
and each step's wall time minus the time inside the model run is recorded.

Target (#27): the median at 60K cached blocks within 10% of the one at 1K."""

from __future__ import annotations

import argparse
import random
import statistics
import time
from pathlib import Path

from agentkv.bench.common import bar_plot, envelope, log, print_paths, table, write_outputs
from agentkv.bench.moe_model import MoEShape, synthetic_moe

SHAPE = MoEShape(layers=1, d=64, heads=2, ffn=32, experts=4, top_k=2, vocab=512, context=4096)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--sizes", default="1000,60000", help="cached blocks of each arm")
    parser.add_argument("--steps", type=int, default=400, help="engine steps timed per arm")
    parser.add_argument("--streams", type=int, default=4, help="requests decoding at once")
    parser.add_argument("--out", default="bench/out")


def engine_with_cache(model: Path, num_cached: int, free_blocks: int = 64):
    """An engine whose pool is `num_cached` cached blocks plus `free_blocks` free ones."""
    from agentkv.runtime.config import CacheConfig, EngineConfig
    from agentkv.runtime.engine import Engine

    cache = CacheConfig(num_blocks=num_cached + free_blocks, block_size=16)
    engine = Engine(EngineConfig(model=str(model), cache=cache, max_model_len=2048))
    rng = random.Random(num_cached)
    filled = 0
    while filled < num_cached:
        num_blocks = min(rng.randrange(1, 9), num_cached - filled)
        blocks = engine.pool.allocate(num_blocks)
        tokens = [rng.randrange(3, SHAPE.vocab) for _ in range(16 * num_blocks)]
        engine.cache.insert((engine.model_name, None), tokens, blocks)
        engine.pool.free(blocks)  # the cache holds them now
        filled += num_blocks
    return engine


class Arm:
    """One engine and its stream of requests, stepped a round at a time."""

    def __init__(self, engine, num_streams: int, seed: int) -> None:
        self.engine, self.num_streams = engine, num_streams
        self.rng, self.in_run, self.times, self.next_id = random.Random(seed), [0.0], [], 0
        run = engine.runner.run

        def timed_run(chunks):
            t0 = time.perf_counter()
            try:
                return run(chunks)
            finally:
                self.in_run[0] += time.perf_counter() - t0

        engine.runner.run = timed_run

    def steps(self, num_steps: int) -> None:
        """Step `num_steps` times, recording each step's Python seconds (wall minus the model run)."""
        from agentkv.runtime.params import SamplingParams

        params = SamplingParams(max_tokens=48, temperature=0.0, ignore_eos=True)
        engine, rng = self.engine, self.rng
        for _ in range(num_steps):
            while len(engine._requests) < self.num_streams:
                prompt = [rng.randrange(3, SHAPE.vocab) for _ in range(rng.randrange(40, 120))]
                engine.add_request(f"r{self.next_id}", prompt, params)
                self.next_id += 1
            self.in_run[0] = 0.0
            t0 = time.perf_counter()
            engine.step()
            self.times.append(time.perf_counter() - t0 - self.in_run[0])


def run(args: argparse.Namespace) -> int:
    model = synthetic_moe(SHAPE, "Q8_0")
    sizes = [int(s) for s in args.sizes.split(",")]
    runs = {}
    for size in sizes:
        log(f"stepcost: filling a cache of {size} blocks")
        runs[size] = Arm(engine_with_cache(model, size), args.streams, seed=1)
    log(f"stepcost: {args.steps} steps per arm, the arms alternating every 25 steps (the load falls on both)")
    for _ in range(0, args.steps, 25):
        for arm in runs.values():
            arm.steps(25)
    arms = {}
    for size, arm in runs.items():
        arm.engine.scheduler.check_integrity()
        arms[size] = {
            "cached_blocks_at_start": size,
            "median_ms": statistics.median(arm.times) * 1e3,
            "p90_ms": sorted(arm.times)[int(0.9 * len(arm.times))] * 1e3,
            "evicted_blocks": arm.engine.cache.evicted_blocks,
        }
    small, big = (arms[s]["median_ms"] for s in sorted(arms)[:: len(arms) - 1])
    payload = envelope("stepcost", steps=args.steps, streams=args.streams, arms=arms, ratio=big / small)
    md = ["# agentkv bench stepcost: Python time per engine step", ""]
    md += table(
        ["cached blocks", "median ms", "p90 ms", "evicted blocks"],
        [[s, f"{a['median_ms']:.3f}", f"{a['p90_ms']:.3f}", a["evicted_blocks"]] for s, a in arms.items()],
    )
    md += ["", f"largest / smallest median: {big / small:.3f} (target <= 1.10)"]
    paths = write_outputs(Path(args.out), "stepcost", payload, md)
    groups = {"median Python ms per step": {f"{s} blocks": a["median_ms"] for s, a in arms.items()}}
    paths["png"] = bar_plot(Path(args.out) / "stepcost.png", "engine step, model run excluded", groups, "ms")
    print("\n".join(md))
    print_paths(paths)
    return 0 if big / small <= 1.10 else 1

"""One-row matmuls over a model's layer weights as a decode step meets them, cold: `python
tools/cold_matmuls.py MODEL [--activation-dtype f32|int8] [--reps 20]` (from the checkout,
`PYTHONPATH` at it). Loads the model, gathers its quantized weights by role (the name without
its `blk.N.` and an expert's `[i]`; a fused gate+up counts as one), and per role times
`Backend.matmul` of one input row over every layer's weight in turn (where a role's weights
together exceed the caches, each comes from memory, as in a decode step); prints MB, ms per
pass and GB/s. The vocab head is timed on its own. What qmatmul.cpp's decode_columns quotes."""

from __future__ import annotations

import argparse
import dataclasses
import re
import time
from collections import defaultdict


def quantized_weights(model) -> dict[str, object]:
    """Every Weight reachable from the model's attributes, by name (quantized rows only)."""
    from agentkv.hal.handles import Layout, Weight

    found, seen, todo = {}, set(), [vars(model)]
    while todo:
        obj = todo.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, Weight):
            if obj.layout is Layout.GGUF_ROWS and obj.name:
                found[obj.name] = obj
        elif isinstance(obj, dict):
            todo.extend(obj.values())
        elif isinstance(obj, (list, tuple)):
            todo.extend(obj)
        elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
            todo.extend(getattr(obj, f.name) for f in dataclasses.fields(obj))
    return found


def time_pass(be, weights, reps: int) -> float:
    import torch

    from agentkv.hal.handles import Tensor

    xs = {w.shape[1]: Tensor(torch.randn(1, w.shape[1])) for w in weights}
    for w in weights:
        be.matmul(xs[w.shape[1]], w)
    start = time.perf_counter()
    for _ in range(reps):
        for w in weights:
            be.matmul(xs[w.shape[1]], w)
    return (time.perf_counter() - start) / reps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("model")
    parser.add_argument("--activation-dtype", choices=("auto", "f32", "int8"), default="auto")
    parser.add_argument("--reps", type=int, default=20)
    args = parser.parse_args()
    import torch

    torch.set_num_threads(2)
    from gguf import GGMLQuantizationType

    from agentkv.runtime.config import engine_config
    from agentkv.runtime.engine import Engine

    engine = Engine(engine_config(args.model, activation_dtype=args.activation_dtype, kv_cache_blocks=64))
    be = engine.backend
    roles = defaultdict(list)
    for name, w in sorted(quantized_weights(engine.runner.model).items()):
        roles[re.sub(r"^blk\.\d+\.|\[\d+\]$", "", name)].append(w)
    print(f"{args.model}: activations {be.activation_dtype}")
    for role, weights in roles.items():
        nbytes = sum(w.raw.numel() * w.raw.element_size() for w in weights)
        dt = time_pass(be, weights, args.reps if len(weights) > 1 else max(1, args.reps // 4))
        first, fmt = weights[0], GGMLQuantizationType(weights[0].qtype).name
        print(
            f"{role:28s} {fmt:6s} {first.shape[0]:>7d} x {first.shape[1]:<6d} x{len(weights):<3d}"
            f" {nbytes / 1e6:8.1f} MB {dt * 1e3:8.2f} ms {nbytes / dt / 1e9:6.1f} GB/s",
            flush=True,
        )


if __name__ == "__main__":
    main()

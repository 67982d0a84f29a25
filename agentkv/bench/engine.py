"""The flags that build agentkv's engine in a benchmark, and the config they build: kept in
one place so that every subcommand builds its engine the same way."""
from __future__ import annotations

import argparse

WEIGHTS = ("resident", "f32")


def add_engine_flags(parser: argparse.ArgumentParser, weights: str = "resident") -> None:
    """--model, --backend and --weights: what every subcommand's agentkv engine is built from."""
    parser.add_argument("--model", default="smollm2", help="model name or GGUF path (default smollm2)")
    parser.add_argument("--backend", default="torch", help="hal backend (default torch)")
    parser.add_argument("--weights", default=weights, choices=WEIGHTS,
                        help=f"agentkv's in-process weights (default {weights})")


def engine_config(args, *, prefix_cache: bool = True, num_blocks: int | None = None,
                  max_model_len: int | None = None):
    """The EngineConfig of `args` (anything with .model, .backend, .weights)."""
    from agentkv.runtime.config import CacheConfig, EngineConfig

    cache = CacheConfig(num_blocks=num_blocks, enable_prefix_cache=prefix_cache)
    return EngineConfig(model=args.model, backend=getattr(args, "backend", "torch"),
                        weights=args.weights, max_model_len=max_model_len, cache=cache)


def build_engine(args, **cache: int | bool | None):
    """An in-process Engine from `engine_config(args, **cache)`."""
    from agentkv.runtime.engine import Engine

    return Engine(engine_config(args, **cache))

"""The flags that build agentkv's engine in a benchmark, and the config they build: the same
config-derived flags as `serve`/`generate` (agentkv.commands.config_flags), plus --model."""

from __future__ import annotations

import argparse

# The knobs a benchmark may set from its command line; the KV size and the prefix cache are
# the benchmark's own choices (each arm sets them), so they are not flags here.
BENCH_KNOBS = ("backend", "weights")
# What `engine_config` reads when present: a suite that carries the KV element type to its
# arms adds `--kv-cache-dtype` (add_engine_flags' `knobs`); the others do not offer it.
ENGINE_KNOBS = (*BENCH_KNOBS, "kv_cache_dtype", "activation_dtype")


def add_engine_flags(
    parser: argparse.ArgumentParser, weights: str = "resident", knobs: tuple[str, ...] = BENCH_KNOBS
) -> None:
    """--model, and the config tree's flags of `knobs` (default --backend, --weights; mutates `parser`)."""
    from agentkv.commands.config_flags import add_engine_arguments

    parser.add_argument("--model", default="smollm2", help="model name or GGUF path (default smollm2)")
    add_engine_arguments(parser, knobs=knobs, model_positional=False)
    parser.set_defaults(weights=weights)


def engine_config(args, *, prefix_cache: bool = True, num_blocks: int | None = None, max_model_len: int | None = None):
    """The EngineConfig of `args` (anything with .model and optionally .backend, .weights,
    .kv_cache_dtype)."""
    from agentkv.runtime.config import engine_config as build

    knobs = {k: getattr(args, k) for k in ENGINE_KNOBS if getattr(args, k, None) is not None}
    return build(
        args.model, **knobs, enable_prefix_cache=prefix_cache, kv_cache_blocks=num_blocks, max_model_len=max_model_len
    )


def build_engine(args, **cache: int | bool | None):
    """An in-process Engine from `engine_config(args, **cache)`."""
    from agentkv.runtime.engine import Engine

    return Engine(engine_config(args, **cache))

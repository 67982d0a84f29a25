"""Flags shared by the commands that load a model and sample from it."""

from __future__ import annotations

import argparse

from agentkv.commands.config_flags import add_engine_arguments
from agentkv.runtime.params import SamplingParams

# The engine knobs of the offline commands: every knob but the serving ones (the name an HTTP
# client uses, the bound on queued HTTP requests, a stalled stream's bound, the pin budgets).
OFFLINE_KNOBS = (
    "backend",
    "weights",
    "activation_dtype",
    "max_model_len",
    "block_size",
    "enable_prefix_cache",
    "kv_cache_blocks",
    "kv_cache_memory",
    "kv_cache_dir",
    "kv_disk_size",
    "kv_write_through",
    "kv_cache_dtype",
    "snapshot_every",
    "max_num_seqs",
    "max_num_batched_tokens",
    "chunk_size",
    "speculative",
    "num_speculative_tokens",
)


def add_model_arguments(p: argparse.ArgumentParser) -> None:
    """MODEL and the engine flags (see config_flags); `config_from_args` reads them back."""
    add_engine_arguments(p, knobs=OFFLINE_KNOBS)


def add_sampling_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--min-p", type=float, default=0.0)
    p.add_argument("--repetition-penalty", type=float, default=1.0)
    p.add_argument("--presence-penalty", type=float, default=0.0)
    p.add_argument("--frequency-penalty", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    p.add_argument("--logprobs", type=int, default=None, help="top logprobs per token")


def sampling_params(args) -> SamplingParams:
    return SamplingParams(
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        min_p=args.min_p,
        repetition_penalty=args.repetition_penalty,
        presence_penalty=args.presence_penalty,
        frequency_penalty=args.frequency_penalty,
        seed=args.seed,
        stop=tuple(args.stop),
        logprobs=args.logprobs,
    )

"""The serve command's LoRA flags: adapters to load at start, and how many per step and in memory."""

from __future__ import annotations

import argparse
from typing import Any


def lora_module(text: str) -> tuple[str, str]:
    """`NAME=PATH` (vLLM's form) -> (name, path); argparse reports a bad one with the flag's name."""
    name, sep, path = text.partition("=")
    if not sep or not name or not path or ":" in name:
        raise argparse.ArgumentTypeError(f"expected NAME=PATH (a name without ':'), got {text!r}")
    return name, path


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text!r}")
    return value


def add_lora_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--lora-modules",
        action="append",
        type=lora_module,
        default=[],
        metavar="NAME=PATH",
        help="a PEFT LoRA adapter folder served as model NAME (or BASE:NAME); repeatable",
    )
    parser.add_argument(
        "--max-loras", type=positive_int, default=None, help="most distinct adapters in one forward (default: no limit)"
    )
    parser.add_argument(
        "--enable-runtime-lora",
        action="store_true",
        help="serve /v1/load_lora_adapter and /v1/unload_lora_adapter (they read any path the server can)",
    )
    parser.add_argument(
        "--lora-dtype",
        choices=("f32", "f16"),
        default="f32",
        help="what adapters are held in: f32 (as the file; default) or f16 (half the bytes a decode step reads, "
        "the cpu backend only)",
    )
    parser.add_argument(
        "--max-cpu-loras",
        type=positive_int,
        default=None,
        help="most adapters kept loaded; the least recently used is reloaded from its path on use (default: all)",
    )


def apply_lora(engine: Any, args: argparse.Namespace) -> None:
    """Set the limits and load `--lora-modules` on a freshly built Engine (raises ValueError,
    e.g. formats.lora.AdapterError naming the file and module, for a bad one)."""
    from agentkv.runtime.engine_state import configure_lora

    configure_lora(engine, args.max_loras, args.max_cpu_loras, args.lora_dtype)
    for name, path in args.lora_modules:
        engine.adapters.load(name, path)

"""The `agentkv` console script: one subcommand per module, imported only when chosen."""

from __future__ import annotations

import argparse
import importlib
import sys

# name -> (module, one-line help). Each module defines add_arguments(parser) and run(args) -> int.
COMMANDS: dict[str, tuple[str, str]] = {
    "inspect": ("agentkv.commands.inspect", "summarise a model file: tensors, formats, tokenizer"),
    "generate": ("agentkv.commands.generate", "complete one or more prompts"),
    "chat": ("agentkv.commands.chat", "interactive chat using the model's template"),
    "witness": ("agentkv.commands.witness", "check a backend op by op against the reference"),
    "serve": ("agentkv.commands.serve", "OpenAI-compatible HTTP server"),
    "bench": ("agentkv.commands.bench", "benchmarks against peers"),
    "cluster": ("agentkv.commands.cluster", "N local workers behind SGLang's cache-aware router"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="agentkv", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (module_name, help_text) in COMMANDS.items():
        sp = sub.add_parser(name, help=help_text, description=help_text)
        sp.set_defaults(_module=module_name)
        # Parsers are only filled for the chosen command, so a missing optional
        # dependency of one command never breaks the others.
        if name in sys.argv[1:2]:
            importlib.import_module(module_name).add_arguments(sp)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    saved, sys.argv = sys.argv, [sys.argv[0], *argv]
    try:
        args = build_parser().parse_args(argv)
    finally:
        sys.argv = saved
    return int(importlib.import_module(args._module).run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())

"""`agentkv serve MODEL`: the OpenAI-compatible HTTP server on uvicorn. The app answers at once
(GET /health is 503 until the model has loaded in a background thread)."""
from __future__ import annotations

import argparse
import logging
import sys
from typing import Any

from agentkv.commands.config_flags import add_engine_arguments, config_from_args


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_engine_arguments(parser)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY'")
    parser.add_argument("--strict-request-fields", action="store_true",
                        help="answer unknown request fields with a 400 (default: log and ignore)")
    parser.add_argument("--log-level", default="info")


def loader(args: argparse.Namespace) -> Any:
    """A zero-argument engine builder, so the app can load in the background. The config is
    built (and a bad flag value raises its ValueError) now, before anything loads."""
    from agentkv.runtime.async_engine import AsyncEngine

    config = config_from_args(args)

    def load() -> AsyncEngine:
        return AsyncEngine.from_config(config)

    return load


def run(args: argparse.Namespace) -> int:
    import uvicorn

    from agentkv.server.app import create_app

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        load = loader(args)
    except ValueError as exc:  # a bad flag value: say which, exit 2 like argparse
        print(f"agentkv serve: {exc}", file=sys.stderr)
        return 2
    app = create_app(load, api_key=args.api_key, served_model_name=args.served_model_name or args.model,
                     strict_request_fields=args.strict_request_fields)
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level.lower())
    return 0

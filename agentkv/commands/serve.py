"""`agentkv serve MODEL`: the OpenAI-compatible HTTP server on uvicorn. The app answers at once
(GET /health is 503 until the model has loaded in a background thread)."""
from __future__ import annotations

import argparse
import logging
from typing import Any


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", help="model alias (smollm2, minilm, ...) or path")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY'")
    parser.add_argument("--served-model-name", default=None, help="the name clients use (default: MODEL)")
    parser.add_argument("--max-model-len", type=int, default=None)
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--kv-cache-blocks", type=int, default=None)
    size.add_argument("--kv-cache-memory", default=None, help="e.g. 512MiB, 2GiB")
    parser.add_argument("--no-prefix-cache", action="store_true")
    parser.add_argument("--backend", default="torch")
    parser.add_argument("--weights", choices=["resident", "f32"], default="resident",
                        help="keep quantized weights quantized (resident) or dequantize at load (f32)")
    parser.add_argument("--strict-request-fields", action="store_true",
                        help="answer unknown request fields with a 400 (default: log and ignore)")
    parser.add_argument("--log-level", default="info")


def loader(args: argparse.Namespace) -> Any:
    """A zero-argument engine builder, so the app can load in the background."""
    from agentkv.runtime.async_engine import AsyncEngine
    from agentkv.runtime.config import parse_size

    memory = parse_size(args.kv_cache_memory) if args.kv_cache_memory else None

    def load() -> Any:
        return AsyncEngine.from_model(
            args.model, backend=args.backend, max_model_len=args.max_model_len,
            kv_cache_blocks=args.kv_cache_blocks, kv_cache_memory=memory,
            enable_prefix_cache=not args.no_prefix_cache, served_model_name=args.served_model_name,
            weights=args.weights)

    return load


def run(args: argparse.Namespace) -> int:
    import uvicorn

    from agentkv.server.app import create_app

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        load = loader(args)
    except ValueError as exc:  # a bad flag value: say which, exit 2 like argparse
        print(f"agentkv serve: {exc}")
        return 2
    app = create_app(load, api_key=args.api_key, served_model_name=args.served_model_name or args.model,
                     strict_request_fields=args.strict_request_fields)
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level.lower())
    return 0

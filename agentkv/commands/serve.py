"""`agentkv serve MODEL`: the OpenAI-compatible HTTP server on uvicorn. The app answers at once
(GET /health is 503 until the model has loaded in a background thread).

Exit codes, for a supervisor: 0 after a normal shutdown; 2 for a bad flag, a bad keys file
or a configuration the model contradicts (e.g. --max-model-len larger than
--kv-cache-blocks / --kv-cache-memory can hold); 1 when the model failed to load otherwise,
or the engine thread died while serving (in-flight requests got a 503 first). Without an
explicit --max-model-len, a KV pool smaller than the model's context clamps the served
max_model_len to what the pool holds, and the log says so."""

from __future__ import annotations

import argparse
import gc
import logging
import sys
from collections.abc import Callable
from typing import Any

from agentkv.commands.config_flags import add_engine_arguments, config_from_args
from agentkv.commands.lora_flags import add_lora_arguments, apply_lora
from agentkv.runtime.config import parse_size

log = logging.getLogger(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_engine_arguments(parser)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    add_access_arguments(parser)
    parser.add_argument(
        "--max-fanout", type=int, default=64, help="most sequences one request may start, prompts x n (default: 64)"
    )
    parser.add_argument(
        "--max-body-bytes",
        type=parse_size,
        default=16 << 20,
        help="largest request body, e.g. 16MiB; larger gets 413 (default: 16MiB)",
    )
    parser.add_argument(
        "--sse-keepalive-s",
        type=float,
        default=15.0,
        help="a quiet stream gets an SSE ': keep-alive' comment this often (default: 15)",
    )
    parser.add_argument(
        "--strict-request-fields",
        action="store_true",
        help="answer unknown request fields with a 400 (default: log and ignore)",
    )
    parser.add_argument(
        "--tool-call-parser",
        default=None,
        metavar="NAME",
        help="the model's tool-call format (hermes, qwen3_coder, llama3_json, pythonic, mistral, mistral_v3, "
        "harmony, deepseek_v3, deepseek_v31, glm45, kimi_k2); default: detected from the chat template",
    )
    parser.add_argument(
        "--reasoning-parser",
        default=None,
        metavar="NAME",
        help="the model's reasoning markers (none, think, mistral, harmony); default: detected",
    )
    parser.add_argument("--log-level", default="info")
    add_lora_arguments(parser)


def add_access_arguments(parser: argparse.ArgumentParser) -> None:
    """Who may use the server: the tenants' keys, the metrics scrape, the admin key."""
    parser.add_argument(
        "--api-key",
        action="append",
        default=None,
        metavar="KEY",
        help="require 'Authorization: Bearer KEY' or 'x-api-key: KEY'; repeat "
        "for several keys, each its own tenant with its own prefix cache",
    )
    parser.add_argument(
        "--api-keys-file",
        default=None,
        metavar="PATH",
        help="more keys, one per line: 'KEY' or 'KEY TENANT' (keys of one "
        "tenant share its cache); '#' starts a comment",
    )
    parser.add_argument(
        "--public-metrics",
        action="store_true",
        help="serve /metrics without an API key even when keys are set (for a private scraper)",
    )
    parser.add_argument(
        "--admin-api-key",
        default=None,
        metavar="KEY",
        help="a key that may flush any tenant's prefix cache or all of it (POST /flush_cache)",
    )


def read_api_keys(path: str) -> dict[str, str | None]:
    """The keys file: key -> tenant name (None: the key is its own tenant). Raises ValueError
    naming the line for a line with more than two fields or a key given twice."""
    keys: dict[str, str | None] = {}
    with open(path, encoding="utf-8") as f:
        for num, line in enumerate(f, 1):
            fields = line.split("#", 1)[0].split()
            if not fields:
                continue
            if len(fields) > 2 or fields[0] in keys:
                why = "has more than 'KEY TENANT'" if len(fields) > 2 else "repeats a key"
                raise ValueError(f"{path}:{num} {why}")
            keys[fields[0]] = fields[1] if len(fields) == 2 else None
    return keys


def api_keys(args: argparse.Namespace) -> dict[str, str | None] | None:
    """Every key the flags give (--api-key repeated, then the keys file); None = no auth."""
    keys: dict[str, str | None] = {key: None for key in args.api_key or ()}
    if args.api_keys_file:
        keys.update(read_api_keys(args.api_keys_file))
    return keys or None


def freeze_heap() -> int:
    """Collect, then move every object alive into the permanent generation, so that no later
    collection scans them. What a load leaves (the model's Python objects, the tokenizer's
    vocabulary: ~290K tracked objects for SmolLM2, ~450K for Gemma-3) otherwise makes each full
    collection hold the GIL for 110-140 ms, which stalls the engine thread and every stream at
    once. vLLM freezes its heap after start-up the same way. Only the serve command calls this:
    it owns its process (an app built inside a test process must not freeze its host's heap).
    Returns how many objects are frozen."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


def loader(args: argparse.Namespace) -> Any:
    """A zero-argument engine builder, so the app can load in the background. The config is
    built (and a bad flag value raises its ValueError) now, before anything loads. Once the
    engine is built, the heap it leaves is frozen (freeze_heap)."""
    from agentkv.runtime.async_engine import AsyncEngine

    config = config_from_args(args)

    def load() -> AsyncEngine:
        engine = AsyncEngine.from_config(config)
        if not engine.is_embedding:
            apply_lora(engine.engine, args)
        log.info("froze %d objects left by the load out of collections", freeze_heap())
        return engine

    return load


def serve_app(
    make_app: Callable[[Callable[[int, str], None]], Any], *, host: str, port: int, log_level: str = "info"
) -> int:
    """Run the app `make_app(on_fatal)` builds until shutdown; the exit code: 0, or the one
    the app's `on_fatal(code, why)` asked for (it also stops the server)."""
    import uvicorn

    fatal: list[tuple[int, str]] = []
    servers: list[uvicorn.Server] = []

    def on_fatal(code: int, why: str) -> None:
        fatal.append((code, why))
        if servers:
            servers[0].should_exit = True

    app = make_app(on_fatal)
    servers.append(uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level=log_level)))
    servers[0].run()
    if fatal:
        code, why = fatal[0]
        print(f"agentkv serve: {why}", file=sys.stderr)
        return code
    return 0


def run(args: argparse.Namespace) -> int:
    from agentkv.server.app import create_app
    from agentkv.server.lifecycle import ServerLimits
    from agentkv.server.toolformats.registry import check_parsers

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        load = loader(args)
        keys = api_keys(args)
        limits = ServerLimits(
            max_fanout=args.max_fanout,
            max_body_bytes=args.max_body_bytes,
            sse_keepalive_s=args.sse_keepalive_s,
            public_metrics=args.public_metrics,
            admin_key=args.admin_api_key,
        )
        check_parsers(args.tool_call_parser, args.reasoning_parser)
    except (ValueError, OSError) as exc:  # a bad flag value or keys file: say which, exit 2
        print(f"agentkv serve: {exc}", file=sys.stderr)
        return 2

    def make_app(on_fatal: Callable[[int, str], None]) -> Any:
        app = create_app(
            load,
            api_key=keys,
            served_model_name=args.served_model_name or args.model,
            strict_request_fields=args.strict_request_fields,
            limits=limits,
            on_fatal=on_fatal,
            runtime_lora=args.enable_runtime_lora,
        )
        app.state.server.set_parsers(args.tool_call_parser, args.reasoning_parser)
        return app

    return serve_app(make_app, host=args.host, port=args.port, log_level=args.log_level.lower())

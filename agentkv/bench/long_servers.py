"""The two servers `agentkv bench long` drives over HTTP, each a child process on 127.0.0.1
with its log in a file (never an undrained pipe): `agentkv serve` (load_server.ServerProcess)
and llama-cpp-python's own OpenAI server, `python -m llama_cpp.server`, with its prompt cache.

The peer's flags, and why each is set:

    --n_threads 2 --n_threads_batch 2   THREADS, like every engine (its batch default is all cores)
    --cache true                        its prompt cache (LlamaRAMCache, --cache_size 2 GiB):
                                        the longest cached prefix's state is loaded per request
    --logits_all false                  its default (true) computes the head for every prompt
                                        position; no request here asks for prompt logprobs
    --interrupt_requests false          its default cuts a running stream when another request
                                        arrives, which would end concurrent agents' turns early
    --n_ctx N                           the longest context the run sends, plus slack
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

from agentkv.bench.load_server import ServerProcess
from agentkv.bench.peers import THREADS, missing

# What `python -m llama_cpp.server` imports beyond llama_cpp (its `server` extra).
PEER_SERVER_MODULES = ("uvicorn", "fastapi", "pydantic_settings", "sse_starlette", "starlette_context", "yaml")


def peer_missing() -> str | None:
    """Why the peer server cannot start here (a skip reason), or None."""
    reason = missing("llamacpp")
    if reason:
        return reason
    absent = [m for m in PEER_SERVER_MODULES if importlib.util.find_spec(m) is None]
    if absent:
        return f"llama_cpp.server needs {', '.join(absent)} (pip install '.[bench]')"
    return None


class PeerServer(ServerProcess):
    """`python -m llama_cpp.server` on the GGUF at `gguf`, 127.0.0.1, flags above. It has no
    /health: `start()` waits for GET /v1/models to answer 200."""

    name = "llama_cpp.server"
    health_path = "/v1/models"

    def __init__(self, gguf: str, n_ctx: int, log_path: Path, cache_bytes: int = 2 << 30) -> None:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        super().__init__(gguf, peer_flags(n_ctx, cache_bytes), log_path=str(log_path))

    @property
    def command(self) -> list[str]:
        where = ["--host", "127.0.0.1", "--port", str(self.port)]
        return [sys.executable, "-m", "llama_cpp.server", "--model", self.model, *where, *self.flags]


def peer_flags(n_ctx: int, cache_bytes: int) -> list[str]:
    """The peer's flags (the module docstring says why each)."""
    return [
        *("--n_threads", str(THREADS), "--n_threads_batch", str(THREADS), "--n_ctx", str(n_ctx)),
        *("--cache", "true", "--cache_type", "ram", "--cache_size", str(cache_bytes)),
        *("--logits_all", "false", "--interrupt_requests", "false", "--verbose", "false"),
    ]


def agentkv_server(model: str, engine_flags: list[str], max_model_len: int, log_path: Path) -> ServerProcess:
    """`agentkv serve MODEL` with the bench engine flags and a context as long as the peer's."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    flags = ["--max-model-len", str(max_model_len), *engine_flags]
    # The kernels' pool and torch take their thread count from here (default: every core).
    env = {**os.environ, "OMP_NUM_THREADS": str(THREADS)}
    return ServerProcess(model, flags, log_path=str(log_path), env=env)

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
import signal
import subprocess
import sys
import time
from pathlib import Path

from agentkv.bench.load_server import ServerProcess, free_port
from agentkv.bench.peers import THREADS, missing
from agentkv.commands.cluster import ClusterError, wait_healthy

# What `python -m llama_cpp.server` imports beyond llama_cpp (its `server` extra).
PEER_SERVER_MODULES = ("uvicorn", "fastapi", "pydantic_settings", "sse_starlette", "starlette_context", "yaml")
STOP_TIMEOUT_S = 30.0


def peer_missing() -> str | None:
    """Why the peer server cannot start here (a skip reason), or None."""
    reason = missing("llamacpp")
    if reason:
        return reason
    absent = [m for m in PEER_SERVER_MODULES if importlib.util.find_spec(m) is None]
    if absent:
        return f"llama_cpp.server needs {', '.join(absent)} (pip install '.[bench]')"
    return None


class PeerServer:
    """`python -m llama_cpp.server` on the GGUF at `gguf`, 127.0.0.1:`port`, flags above.
    It has no /health: `start()` waits for GET /v1/models to answer 200."""

    def __init__(self, gguf: str, n_ctx: int, log_path: Path, cache_bytes: int = 2 << 30) -> None:
        self.gguf, self.n_ctx, self.log_path, self.cache_bytes = gguf, n_ctx, log_path, cache_bytes
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None

    @property
    def flags(self) -> list[str]:
        return [
            "--n_threads",
            str(THREADS),
            "--n_threads_batch",
            str(THREADS),
            "--n_ctx",
            str(self.n_ctx),
            "--cache",
            "true",
            "--cache_type",
            "ram",
            "--cache_size",
            str(self.cache_bytes),
            "--logits_all",
            "false",
            "--interrupt_requests",
            "false",
            "--verbose",
            "false",
        ]

    @property
    def command(self) -> list[str]:
        where = ["--host", "127.0.0.1", "--port", str(self.port)]
        return [sys.executable, "-m", "llama_cpp.server", "--model", self.gguf, *where, *self.flags]

    def start(self, timeout_s: float = 300.0) -> float:
        """Start and wait until it serves: the seconds that took. Raises RuntimeError (with
        the log's tail) if it exits first or is not up in `timeout_s`."""
        t0 = time.perf_counter()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log_file:
            self.proc = subprocess.Popen(
                self.command, stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True
            )
        try:
            wait_healthy(self.base, self.proc, time.monotonic() + timeout_s, what="llama_cpp.server", path="/v1/models")
        except ClusterError as exc:
            self.stop()
            tail = self.log_path.read_text(errors="replace")[-2000:]
            raise RuntimeError(f"{exc} (log {self.log_path}): {tail}") from None
        return time.perf_counter() - t0

    def stop(self) -> None:
        """SIGTERM to its process group (uvicorn shuts down), SIGKILL if it lingers."""
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


def agentkv_server(model: str, engine_flags: list[str], max_model_len: int, log_path: Path) -> ServerProcess:
    """`agentkv serve MODEL` with the bench engine flags and a context as long as the peer's."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    flags = ["--max-model-len", str(max_model_len), *engine_flags]
    # The kernels' pool and torch take their thread count from here (default: every core).
    env = {**os.environ, "OMP_NUM_THREADS": str(THREADS)}
    return ServerProcess(model, flags, log_path=str(log_path), env=env)

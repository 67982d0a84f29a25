"""The server process `agentkv bench load` drives: `agentkv serve` in a child process on a free
127.0.0.1 port (so it can be killed with SIGKILL and restarted), and its /metrics read back."""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from typing import NamedTuple

from agentkv.commands.ports import free_port

# The admission-control flag is newer than this benchmark: it is passed only where `serve`
# has it, and the report says whether it was.
QUEUE_FLAG = "--max-queued-requests"


class PoolState(NamedTuple):
    """The engine's gauges from /metrics. `held` = blocks some request still holds: used
    blocks that are not merely kept by the prefix cache. Idle means held, running and
    waiting are all zero."""

    used: int
    free: int
    cached: int
    running: int
    waiting: int

    @property
    def held(self) -> int:
        return self.used - self.cached

    @property
    def idle(self) -> bool:
        return self.held == 0 and self.running == 0 and self.waiting == 0


def serve_has_flag(flag: str) -> bool:
    from agentkv.commands.serve import add_arguments

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return flag in parser._option_string_actions  # pylint: disable=protected-access


class ServerProcess:
    """`agentkv serve MODEL FLAGS` on 127.0.0.1:`port`; `start()` waits for /health 200."""

    name = "agentkv serve"  # in errors
    health_path = "/health"

    def __init__(
        self,
        model: str,
        flags: list[str],
        port: int | None = None,
        log_path: str | None = None,
        env: dict | None = None,
    ) -> None:
        self.model, self.flags, self.env = model, flags, env  # env None: this process's
        self.port = port or free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path or os.devnull
        self.proc: subprocess.Popen | None = None

    @property
    def command(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "agentkv.cli",
            "serve",
            self.model,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--log-level",
            "warning",
            *self.flags,
        ]

    def start(self, timeout_s: float = 600.0) -> float:
        """Start and wait until GET `health_path` answers 200: the seconds that took. Raises
        RuntimeError naming the log if it exits first or is not up in `timeout_s`."""
        from agentkv.commands.cluster import ClusterError, wait_healthy

        t0 = time.perf_counter()
        with open(self.log_path, "ab") as log_file:
            self.proc = subprocess.Popen(self.command, stdout=log_file, stderr=subprocess.STDOUT, env=self.env)
        try:
            wait_healthy(self.base, self.proc, time.monotonic() + timeout_s, what=self.name, path=self.health_path)
        except ClusterError as exc:
            self.stop()
            raise RuntimeError(f"{exc}: {' '.join(self.command)} (log: {self.log_path})") from None
        return time.perf_counter() - t0

    def kill(self) -> int:
        """SIGKILL, as a crash or an OOM killer would: no shutdown code runs. Returns the code."""
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGKILL)
        return self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill()


def parse_metrics(text: str) -> dict[str, float]:
    """Unlabelled samples of a Prometheus text page, by name."""
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#") and "{" not in line:
            name, _, value = line.partition(" ")
            out[name] = float(value)
    return out


def pool_state(base: str) -> PoolState:
    import httpx

    m = parse_metrics(httpx.get(f"{base}/metrics", timeout=30).text)
    return PoolState(
        used=int(m["agentkv_kv_blocks_used"]),
        free=int(m["agentkv_kv_blocks_free"]),
        cached=int(m.get("agentkv_kv_blocks_cached", 0)),
        running=int(m["agentkv_num_requests_running"]),
        waiting=int(m["agentkv_num_requests_waiting"]),
    )


def wait_idle(base: str, timeout_s: float, poll_s: float = 0.05) -> tuple[float | None, PoolState]:
    """Poll /metrics until the pool is idle: (seconds it took or None, last state)."""
    t0 = time.perf_counter()
    while True:
        state = pool_state(base)
        elapsed = time.perf_counter() - t0
        if state.idle:
            return elapsed, state
        if elapsed >= timeout_s:
            return None, state
        time.sleep(poll_s)

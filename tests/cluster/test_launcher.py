"""`agentkv cluster` as a user runs it: it comes up behind the router, answers through it, and
SIGTERM stops every process it started."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
import urllib.request

import psutil
import pytest

from agentkv.bench.cluster import post_chat
from agentkv.commands.ports import free_ports
from tests.cluster.conftest import needs_router

pytestmark = [needs_router, pytest.mark.timeout(900)]


def test_cluster_command_starts_serves_and_stops_all(kernels_built) -> None:
    port = free_ports(4)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "agentkv.cli",
            "cluster",
            "--replicas",
            "1",
            "--router-port",
            str(port),
            "--max-model-len",
            "512",
            "--kv-cache-blocks",
            "64",
            "smollm2",
        ]
    )
    try:
        deadline = time.monotonic() + 600
        while True:
            assert proc.poll() is None, "agentkv cluster exited early"
            assert time.monotonic() < deadline, "router never answered"
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/readiness", timeout=2) as resp:
                    if resp.status == 200:
                        break
            except OSError:
                time.sleep(0.5)
        started = psutil.Process(proc.pid).children(recursive=True)
        assert len(started) >= 2  # the worker and the router
        status, data = post_chat(
            f"http://127.0.0.1:{port}",
            {"model": "smollm2", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
        )
        assert status == 200, data
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    gone, alive = psutil.wait_procs(started, timeout=30)
    assert not alive, alive


def test_sigterm_while_starting_stops_the_workers_and_exits_zero(kernels_built) -> None:
    """A supervisor may stop the launcher before the router is up (CI once sent SIGTERM while
    the router was still registering its worker, and the launcher died by the signal)."""
    port = free_ports(4)
    cmd = [sys.executable, "-m", "agentkv.cli", "cluster", "--replicas", "1", "--router-port", str(port), "smollm2"]
    proc = subprocess.Popen(cmd)
    launcher = psutil.Process(proc.pid)
    deadline = time.monotonic() + 120
    while not launcher.children(recursive=True):
        assert proc.poll() is None, "agentkv cluster exited early"
        assert time.monotonic() < deadline, "no worker was started"
        time.sleep(0.1)
    time.sleep(1.0)  # past the imports: the launcher now waits for the worker's /health
    started = launcher.children(recursive=True)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0
    gone, alive = psutil.wait_procs(started, timeout=30)
    assert not alive, alive

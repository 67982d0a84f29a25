"""`agentkv cluster --replicas N MODEL`: N local `agentkv serve` workers behind SGLang's router
(the optional `sglang-router` package: `pip install agentkv[cluster]`).

    agentkv cluster --replicas 3 --router-port 30000 smollm2

starts the workers on ports router_port+1 .. router_port+N, waits until each answers
GET /health with 200, starts `python -m sglang_router.launch_router` in front of them, waits
for the router's /health, then serves until interrupted and stops every process on exit.
Every port opened (workers, router, the router's Prometheus metrics) binds to --host,
loopback by default. `Cluster` is the same thing as a context manager for tests and benches."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import http.client
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence

from agentkv.commands.config_flags import FLAGS, add_engine_arguments
from agentkv.runtime.config import knob_default

POLICIES = ("cache_aware", "round_robin", "random", "power_of_two", "manual")
ROUTER_MODULE = "sglang_router.launch_router"


@dataclasses.dataclass(frozen=True, slots=True)
class ClusterSpec:
    """What to start. `worker_args` are extra `agentkv serve` flags (engine knobs);
    `router_args` extra `launch_router` flags. Ports: router at `router_port`, workers at
    `worker_base_port + i` (default router_port + 1 + i), metrics at `metrics_port`
    (default router_port + replicas + 1)."""

    model: str
    replicas: int = 2
    host: str = "127.0.0.1"
    router_port: int = 30000
    worker_base_port: int | None = None
    metrics_port: int | None = None
    policy: str = "cache_aware"
    worker_args: tuple[str, ...] = ()
    router_args: tuple[str, ...] = ()
    health_check_interval_s: int = 2
    startup_timeout_s: float = 600.0
    front_port: int | None = None  # the LoRA-aware front door (commands/cluster_front.py), if any

    def __post_init__(self) -> None:
        if not 1 <= self.replicas <= 64:
            raise ValueError(f"replicas={self.replicas} is out of range: allowed 1..64")
        if self.policy not in POLICIES:
            raise ValueError(f"policy={self.policy!r} is not allowed: use one of {POLICIES}")
        for name in ("router_port", "worker_base_port", "metrics_port"):
            port = getattr(self, name)
            if port is not None and not 1 <= port <= 65535 - self.replicas:
                raise ValueError(f"{name}={port} is out of range: allowed 1..{65535 - self.replicas}")

    @property
    def worker_ports(self) -> list[int]:
        base = self.worker_base_port if self.worker_base_port is not None else self.router_port + 1
        return [base + i for i in range(self.replicas)]

    @property
    def prometheus_port(self) -> int:
        return self.metrics_port if self.metrics_port is not None else self.router_port + self.replicas + 1

    @property
    def router_url(self) -> str:
        return f"http://{_url_host(self.host)}:{self.router_port}"

    @property
    def front_url(self) -> str:
        return f"http://{_url_host(self.host)}:{self.front_port}"

    @property
    def worker_urls(self) -> list[str]:
        return [f"http://{_url_host(self.host)}:{p}" for p in self.worker_ports]


class ClusterError(RuntimeError):
    """A process of the cluster failed to start or become healthy (the message says which)."""


class Cluster:
    """The running processes of one ClusterSpec. `start()` blocks until all are healthy;
    `stop()` (or leaving the `with` block) terminates them, the router first."""

    def __init__(self, spec: ClusterSpec) -> None:
        self.spec = spec
        self.workers: list[subprocess.Popen] = []
        self.router: subprocess.Popen | None = None
        self.front: subprocess.Popen | None = None

    def __enter__(self) -> Cluster:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        spec = self.spec
        for index, port in enumerate(spec.worker_ports):
            self.workers.append(
                _spawn(
                    [
                        sys.executable,
                        "-m",
                        "agentkv.cli",
                        "serve",
                        spec.model,
                        "--host",
                        spec.host,
                        "--port",
                        str(port),
                        "--log-level",
                        "warning",
                        *own_tier(spec.worker_args, index, spec.replicas),
                    ]
                )
            )
        deadline = time.monotonic() + spec.startup_timeout_s
        for proc, url in zip(self.workers, spec.worker_urls):
            wait_healthy(url, proc, deadline, what="worker")
        self.router = launch_router(spec, deadline)
        if spec.front_port is not None:
            self.front = _spawn(front_command(spec))
            wait_healthy(spec.front_url, self.front, deadline, what="front")

    def kill_worker(self, index: int) -> None:
        """SIGKILL worker `index` (a crash, not a shutdown) and reap it."""
        proc = self.workers[index]
        proc.kill()
        proc.wait()

    def stop(self) -> None:
        procs = [p for p in (self.front, self.router) if p is not None] + self.workers
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.workers, self.router, self.front = [], None, None


def launch_router(spec: ClusterSpec, deadline: float) -> subprocess.Popen:
    """Start the router of `spec` in front of `spec.worker_urls` (already running) and wait
    for its /health. Several routers may front the same workers (one per policy)."""
    proc = _spawn(router_command(spec))
    try:
        wait_healthy(spec.router_url, proc, deadline, what="router")
        wait_registered(spec, proc, deadline)
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    return proc


def front_command(spec: ClusterSpec) -> list[str]:
    """The LoRA-aware front's command line (in front of the router)."""
    front = ["--router", spec.router_url, "--host", spec.host, "--port", str(spec.front_port)]
    return [sys.executable, "-m", "agentkv.commands.cluster_front", *front]


def router_command(spec: ClusterSpec) -> list[str]:
    """The `launch_router` command line. The health check runs every few seconds and one
    failure marks a worker unhealthy, so a dead worker leaves the rotation quickly."""
    return [
        sys.executable,
        "-m",
        ROUTER_MODULE,
        "--worker-urls",
        *spec.worker_urls,
        "--policy",
        spec.policy,
        "--host",
        spec.host,
        "--port",
        str(spec.router_port),
        "--prometheus-host",
        spec.host,
        "--prometheus-port",
        str(spec.prometheus_port),
        "--health-check-interval-secs",
        str(spec.health_check_interval_s),
        "--health-failure-threshold",
        "1",
        "--health-check-timeout-secs",
        "2",
        "--cb-failure-threshold",
        "2",
        "--retry-max-retries",
        "3",
        "--log-level",
        "warn",
        *spec.router_args,
    ]


def wait_healthy(url: str, proc: subprocess.Popen, deadline: float, *, what: str, path: str = "/health") -> None:
    """Poll `url` + `path` until 200 (`path`: a server without /health names another GET);
    raise ClusterError if `proc` exits or time runs out."""
    while True:
        if proc.poll() is not None:
            raise ClusterError(f"{what} at {url} exited with code {proc.returncode} before it was healthy")
        # HTTPException: a reply that is not HTTP yet (a socket still coming up, or a poll that
        # connected to itself on a port in the ephemeral range: see agentkv.commands.ports)
        with contextlib.suppress(urllib.error.URLError, ConnectionError, TimeoutError, http.client.HTTPException):
            with urllib.request.urlopen(url + path, timeout=2) as resp:
                if resp.status == 200:
                    return
        if time.monotonic() > deadline:
            raise ClusterError(f"{what} at {url} was not healthy in time")
        time.sleep(0.5)


def wait_registered(spec: ClusterSpec, proc: subprocess.Popen, deadline: float) -> None:
    """The router registers workers in the background after its /health answers: poll its
    /get_loads until every worker is listed with a load it could read (not -1)."""
    import json

    while True:
        if proc.poll() is not None:
            raise ClusterError(f"router at {spec.router_url} exited with code {proc.returncode}")
        with contextlib.suppress(urllib.error.URLError, ConnectionError, TimeoutError, ValueError):
            with urllib.request.urlopen(spec.router_url + "/get_loads", timeout=5) as resp:
                loads = json.loads(resp.read()).get("workers", [])
            if sorted(e["worker"] for e in loads if e["load"] >= 0) == sorted(spec.worker_urls):
                return
        if time.monotonic() > deadline:
            raise ClusterError(f"router at {spec.router_url} did not register {spec.worker_urls}")
        time.sleep(0.5)


def own_tier(worker_args: tuple[str, ...], index: int, replicas: int) -> list[str]:
    """Worker `index`'s flags: a `--kv-cache-dir DIR` becomes its own `DIR/worker-<index>`
    (two engines writing one folder would enforce its budget twice and could not tell their
    files apart at a restart), and `--kv-disk-size` its share of the budget."""
    out = list(worker_args)
    for i, flag in enumerate(out[:-1]):
        if flag == "--kv-cache-dir":
            out[i + 1] = os.path.join(out[i + 1], f"worker-{index}")
        elif flag == "--kv-disk-size":
            out[i + 1] = str(max(1, int(out[i + 1]) // replicas))
    if "--kv-cache-dir" in out and "--kv-disk-size" not in out:
        out += ["--kv-disk-size", str(max(1, knob_default("kv_disk_size") // replicas))]
    return out


def worker_flags(args: argparse.Namespace) -> list[str]:
    """The `agentkv serve` flags for the engine knobs given on this command line (those left
    at their defaults are not repeated)."""
    out: list[str] = []
    for knob, flag in FLAGS.items():
        value = getattr(args, knob, None)
        if knob == "served_model_name" or value == knob_default(knob):
            continue
        if isinstance(value, bool):
            out.append(flag.flag if value else "--no-" + flag.flag[2:])
        elif value is not None:
            out += [flag.flag, str(value)]
    return out


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_engine_arguments(parser)
    parser.add_argument("--replicas", type=int, default=2, help="local workers to start")
    parser.add_argument(
        "--host", default="127.0.0.1", help="address every port binds to (workers, router, router metrics)"
    )
    parser.add_argument("--router-port", type=int, default=30000)
    parser.add_argument(
        "--worker-base-port", type=int, default=None, help="first worker port (default: router port + 1)"
    )
    parser.add_argument(
        "--metrics-port", type=int, default=None, help="router Prometheus port (default: router port + replicas + 1)"
    )
    parser.add_argument("--policy", default="cache_aware", choices=POLICIES)
    parser.add_argument(
        "--front-port",
        type=int,
        default=None,
        help="serve a front door on this port that puts a LoRA adapter into the text the router hashes",
    )
    parser.add_argument(
        "--router-arg",
        action="append",
        default=[],
        help="extra launch_router argument (repeatable), e.g. --router-arg=--api-key=K",
    )


def spec_from_args(args: argparse.Namespace) -> ClusterSpec:
    extra = ["--served-model-name", args.served_model_name or args.model]
    return ClusterSpec(
        model=args.model,
        replicas=args.replicas,
        host=args.host,
        router_port=args.router_port,
        worker_base_port=args.worker_base_port,
        metrics_port=args.metrics_port,
        policy=args.policy,
        worker_args=tuple(worker_flags(args) + extra),
        router_args=tuple(args.router_arg),
        front_port=args.front_port,
    )


def router_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("sglang_router") is not None


def run(args: argparse.Namespace) -> int:
    if not router_available():
        print("agentkv cluster: the router is not installed; pip install 'agentkv[cluster]'", file=sys.stderr)
        return 2
    try:
        spec = spec_from_args(args)
    except ValueError as exc:
        print(f"agentkv cluster: {exc}", file=sys.stderr)
        return 2
    # SIGTERM is handled from the first moment: a supervisor may stop the launcher while the
    # router is still registering its workers, and every process must still be stopped.
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        with contextlib.suppress(KeyboardInterrupt), Cluster(spec) as cluster:
            print(
                f"router {spec.router_url} -> workers {' '.join(spec.worker_urls)} "
                f"(policy {spec.policy}, metrics {spec.host}:{spec.prometheus_port})",
                flush=True,
            )
            _serve_until_exit(cluster)
    finally:
        signal.signal(signal.SIGTERM, previous)
    return 0


def _serve_until_exit(cluster: Cluster) -> None:
    """Block until SIGINT/SIGTERM or until a process of the cluster exits."""
    procs: Sequence[subprocess.Popen] = [p for p in (cluster.front, cluster.router) if p is not None]
    procs = [*procs, *cluster.workers]
    while all(p.poll() is None for p in procs):
        time.sleep(1.0)
    print("agentkv cluster: a process exited; stopping the cluster", file=sys.stderr)


def _interrupt(signum: int, frame: object) -> None:
    """SIGTERM ends the launcher like Ctrl-C does: through `Cluster.__exit__`, which stops all."""
    raise KeyboardInterrupt


def _spawn(cmd: list[str]) -> subprocess.Popen:
    # Own process group: a Ctrl-C in the terminal reaches this launcher, which stops the rest.
    return subprocess.Popen(
        cmd, stdin=subprocess.DEVNULL, start_new_session=True, env={**os.environ, "PYTHONUNBUFFERED": "1"}
    )


def _url_host(host: str) -> str:
    if host in ("0.0.0.0", ""):
        return "127.0.0.1"
    return f"[{host}]" if ":" in host else host

"""Fleets for the cluster tests: real `agentkv serve` worker processes and real sglang-router
processes on free 127.0.0.1 ports. Router tests skip, with the reason, without the router."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator

import pytest

from agentkv.commands.cluster import Cluster, ClusterSpec, launch_router, router_available
from agentkv.commands.ports import free_ports

WORKER_ARGS = ("--max-model-len", "2048", "--kv-cache-blocks", "1024")

needs_router = pytest.mark.skipif(
    not router_available(), reason="sglang-router is not installed (pip install 'agentkv[cluster]')"
)


@pytest.fixture(scope="session")
def kernels_built() -> None:
    """Build the CPU kernels here, once, so the workers do not all compile them at once."""
    from agentkv.hal.kernels import loader

    loader.load()


@pytest.fixture(scope="module")
def fleet(kernels_built: None) -> Iterator[Cluster]:
    """Three smollm2 workers behind a cache_aware router."""
    base = free_ports(8)
    spec = ClusterSpec(model="smollm2", replicas=3, router_port=base, worker_args=WORKER_ARGS)
    with Cluster(spec) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def solo(kernels_built: None) -> Iterator[Cluster]:
    """One smollm2 worker (reached directly, not through its router): the reference fleet."""
    base = free_ports(4)
    spec = ClusterSpec(model="smollm2", replicas=1, router_port=base, worker_args=WORKER_ARGS)
    with Cluster(spec) as cluster:
        yield cluster


@pytest.fixture
def extra_router(fleet: Cluster) -> Iterator[Callable[[str], str]]:
    """Start another router, with `policy`, in front of the fleet's workers; -> its URL."""
    procs = []

    def start(policy: str) -> str:
        base = free_ports(2)
        spec = dataclasses.replace(
            fleet.spec,
            policy=policy,
            router_port=base,
            metrics_port=base + 1,
            worker_base_port=fleet.spec.worker_ports[0],
        )
        procs.append(launch_router(spec, time.monotonic() + 120))
        return spec.router_url

    yield start
    for proc in procs:
        proc.terminate()
        proc.wait(timeout=15)

"""The engine says what computes its bits: stats() and one INFO line at start name the
backend, its kernel ISA and kernel build."""

from __future__ import annotations

import logging

import pytest

from agentkv.hal.base import BackendUnavailable
from agentkv.hal.registry import lookup
from tests.runtime.test_exactness import make_engine, qwen2_dir  # noqa: F401


@pytest.mark.parametrize("backend", ["cpu", "torch"])
def test_stats_and_start_log_name_the_backend(backend, qwen2_dir, caplog):  # noqa: F811
    try:
        identity = lookup(backend).identity
    except BackendUnavailable as e:
        pytest.skip(str(e))
    with caplog.at_level(logging.INFO, logger="agentkv.runtime.engine"):
        engine = make_engine(qwen2_dir, backend=backend, num_blocks=16)
    stats = engine.stats()
    assert (stats.backend, stats.isa, stats.kernel_build) == (backend, identity.isa, identity.kernel_build)
    kernels = identity.kernel_build or "none"
    line = f"backend {backend}, isa {identity.isa or 'none'}, kernels {kernels}, kv f32, activations f32"
    assert line in caplog.messages
    if backend == "cpu":
        assert stats.isa in ("avx2", "avx512") and stats.kernel_build
    else:
        assert stats.isa is None and stats.kernel_build is None


def test_default_backend_is_cpu():
    from agentkv.runtime.config import EngineConfig

    assert EngineConfig(model="m").backend == "cpu"

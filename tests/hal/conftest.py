"""Shared fixtures of the hal tests: which build of the compiled kernels a test runs on."""

from __future__ import annotations

import pytest
import torch

from agentkv.hal.base import BackendUnavailable
from agentkv.hal.kernels import load

try:
    K = load()
except BackendUnavailable:
    K = None

ISAS = [name for name in ("avx2", "avx512") if K is not None and K.isa_supported(name)]


@pytest.fixture(scope="session")
def runnable_isas() -> list[str]:
    return list(ISAS)


@pytest.fixture(params=["avx2", "avx512"])
def isa(request):
    """Each kernel test runs on both builds (AVX2, AVX-512) where the CPU has them. The first
    kernel call fixes a process's ISA, so this switch is the unchecked one kept for tests."""
    if request.param not in ISAS:
        pytest.skip(f"this CPU cannot run the {request.param} kernels")
    before = K.isa()
    K.override_isa_unchecked(request.param)
    yield request.param
    K.override_isa_unchecked(before)


@pytest.fixture(params=[1, 2], ids=lambda t: f"threads{t}")
def threads(request):
    """Runs a test with 1 and with 2 kernel threads (threads split work, never bits)."""
    before = torch.get_num_threads()
    torch.set_num_threads(request.param)
    yield request.param
    torch.set_num_threads(before)

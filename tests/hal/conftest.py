"""Shared fixtures of the hal tests: which build of the compiled kernels a test runs on."""
from __future__ import annotations

import pytest
import torch

from agentkv.hal.kernels import load

K = load()


def _runnable_isas() -> list[str]:
    if K is None:
        return []
    before, found = K.isa(), []
    for name in ("avx2", "avx512"):
        try:
            K.set_isa(name)
            found.append(name)
        except RuntimeError:  # this CPU lacks it
            pass
    K.set_isa(before)
    return found


ISAS = _runnable_isas()


@pytest.fixture(scope="session")
def runnable_isas() -> list[str]:
    return list(ISAS)


@pytest.fixture(params=["avx2", "avx512"])
def isa(request):
    """Each kernel test runs on both builds (AVX2, AVX-512) where the CPU has them."""
    if request.param not in ISAS:
        pytest.skip(f"this CPU cannot run the {request.param} kernels")
    before = K.isa()
    K.set_isa(request.param)
    yield request.param
    K.set_isa(before)


@pytest.fixture(params=[1, 2], ids=lambda t: f"threads{t}")
def threads(request):
    """Runs a test with 1 and with 2 kernel threads (threads split work, never bits)."""
    before = torch.get_num_threads()
    torch.set_num_threads(request.param)
    yield request.param
    torch.set_num_threads(before)

"""`lookup` never falls back: the named backend, or an error naming why not."""

from __future__ import annotations

import stat
import sys

import pytest
import torch

from agentkv.hal import registry
from agentkv.hal.base import BackendUnavailable
from agentkv.hal.kernels import unavailable_reason
from agentkv.hal.registry import UnknownBackend, lookup, names
from tests.hal.subproc import run_python


def test_every_registered_backend_is_itself_or_raises():
    """No name ever yields another backend: each lookup is that backend or BackendUnavailable."""
    assert {"reference", "cpu", "torch", "torch-cuda"} <= set(names())
    for name in names():
        try:
            backend = lookup(name)
        except BackendUnavailable as e:
            assert name in str(e), e
            continue
        assert backend.name == name and backend.identity.name == name


def test_unknown_backend_names_the_value_and_the_choices():
    with pytest.raises(UnknownBackend, match=r"'no-such-backend'; registered: .*cpu.*reference"):
        lookup("no-such-backend")


def test_there_is_no_falling_back_api():
    assert not hasattr(registry, "pick")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA path")
def test_cuda_backend_without_a_device_raises():
    with pytest.raises(BackendUnavailable, match="CUDA"):
        lookup("torch-cuda")


def test_a_factory_that_builds_another_backend_is_refused():
    """The control for the name check above: a factory that hands back the reference under
    another name is caught, not returned."""
    registry.register("test-impostor", registry._REGISTRY["reference"].factory, "approx")
    try:
        with pytest.raises(RuntimeError, match="'test-impostor'.*built backend 'reference'"):
            lookup("test-impostor")
    finally:
        del registry._REGISTRY["test-impostor"]


CPU_LOOKUP = """
from agentkv.hal.base import BackendUnavailable
from agentkv.hal.registry import lookup
try:
    lookup('cpu')
except BackendUnavailable as e:
    print('UNAVAILABLE', e)
else:
    print('AVAILABLE')
"""


def test_cpu_without_a_compiler_raises_naming_it(tmp_path):
    """A fresh process and kernel cache whose CXX does not exist: `cpu` refuses to start and
    says why, instead of running pure torch."""
    r = run_python(CPU_LOOKUP, CXX="no-such-compiler-agentkv", HOME=str(tmp_path))
    assert "UNAVAILABLE backend 'cpu' cannot run here: no C++ compiler ('no-such-compiler-agentkv'" in r.stdout


def test_cpu_with_a_failing_build_raises_with_the_compilers_message(tmp_path):
    """A compiler that exists but fails, in a fresh kernel cache: its own message comes back."""
    cxx = tmp_path / "broken-cxx"
    cxx.write_text(
        "#!/bin/sh\n"  # answers torch's version probe, then fails every compile
        "if [ \"$1\" = --version ]; then echo 'g++ (GCC) 12.2.0'; exit 0; fi\n"
        "echo 'broken-cxx: deliberate failure' >&2\nexit 1\n"
    )
    cxx.chmod(cxx.stat().st_mode | stat.S_IXUSR)
    r = run_python(CPU_LOOKUP, CXX=str(cxx), HOME=str(tmp_path))
    assert r.stdout.startswith("UNAVAILABLE backend 'cpu' cannot run here: the kernel build failed"), r.stdout
    assert "broken-cxx: deliberate failure" in r.stdout


def test_cpu_lacking_avx2_names_the_missing_flags(monkeypatch):
    """The loader's reason function on a fake /proc/cpuinfo; with every flag and a compiler
    on hand (the control) nothing stands in the way."""
    monkeypatch.setenv("CXX", sys.executable)
    assert unavailable_reason("processor\t: 0\nflags\t\t: fpu sse sse2 fma\n") == "CPU lacks avx2, f16c"
    assert unavailable_reason("processor\t: 0\nflags\t\t: fpu avx2 fma f16c\n") is None

"""The kernel ISA is fixed by the first kernel call: switching it afterwards raises (the bits
behind cached KV would change), before it works, and the same ISA again is always fine. Each
case runs in a fresh process: in this one the kernels have long since run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentkv.hal.base import BackendUnavailable
from agentkv.hal.kernels import load
from tests.hal.subproc import run_python

try:
    K = load()
except BackendUnavailable as e:
    pytest.skip(f"the cpu backend cannot run here: {e}", allow_module_level=True)

HAS_AVX512 = K.isa_supported("avx512")
needs_avx512 = pytest.mark.skipif(not HAS_AVX512, reason="this CPU has no AVX-512: only one ISA to switch to")

SWITCH = """
import json, torch
from agentkv.hal.kernels import load
K = load()
out = {'fixed_at_start': K.isa_fixed()}
def attempt(name):
    try:
        K.set_isa(name)
        return 'ok'
    except RuntimeError as e:
        return str(e)
for name in ISAS_BEFORE:
    out['before ' + name] = attempt(name)
out['isa before'] = K.isa()
K.matmul_f32(torch.ones(2, 32), torch.ones(3, 32))  # the first kernel call
out['fixed_after_call'] = K.isa_fixed()
out['isa after'] = K.isa()
for name in ('avx2', 'avx512'):
    out['after ' + name] = attempt(name)
out['isa at end'] = K.isa()
print(json.dumps(out))
"""


def _switch(isas_before: list[str], **env) -> dict:
    r = run_python(f"ISAS_BEFORE = {isas_before!r}\n" + SWITCH, **env)
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_avx2_before_first_use_then_fixed():
    out = _switch(["avx2"])
    assert out["fixed_at_start"] is False and out["before avx2"] == "ok" and out["isa before"] == "avx2"
    assert out["fixed_after_call"] is True and out["isa after"] == "avx2"
    assert out["after avx2"] == "ok"  # the same ISA again is fine
    if HAS_AVX512:
        assert "fixed at avx2 since the first kernel call; switching to avx512" in out["after avx512"]
    else:
        assert "cannot run the avx512 kernels" in out["after avx512"]
    assert out["isa at end"] == "avx2"


@needs_avx512
def test_avx512_before_first_use_then_fixed():
    out = _switch(["avx2", "avx512"])  # switching freely before any kernel ran
    assert out["before avx2"] == out["before avx512"] == "ok" and out["isa before"] == "avx512"
    assert out["after avx512"] == "ok"
    assert "fixed at avx512 since the first kernel call; switching to avx2" in out["after avx2"]
    assert out["isa at end"] == "avx512"


def test_the_env_var_sets_the_isa_before_first_use():
    out = _switch([], AGENTKV_CPU_ISA="avx2")
    assert out["isa before"] == "avx2" and out["isa at end"] == "avx2"


def test_no_backend_uses_the_unchecked_switch():
    """override_isa_unchecked is for tests comparing the two builds; no code of the package
    may call it (it would change bits behind cached KV)."""
    package = Path(__file__).resolve().parents[2] / "agentkv"
    callers = [str(p) for p in package.rglob("*.py") if "override_isa_unchecked" in p.read_text()]
    assert callers == []


IDENTITY = """
import json
from agentkv.hal.registry import lookup
b = lookup('cpu')
print(json.dumps([b.identity, b.fingerprint, b._kernels.isa_fixed()]))
"""


def _cpu_identity(**env) -> tuple[list, str, bool]:
    identity, fingerprint, fixed = json.loads(run_python(IDENTITY, **env).stdout.strip().splitlines()[-1])
    return identity, fingerprint, fixed


def test_cpu_fingerprint_is_stable_across_processes_and_fixes_the_isa():
    from agentkv.hal.registry import lookup

    here = lookup("cpu")
    identity, fingerprint, fixed = _cpu_identity(AGENTKV_CPU_ISA=here.identity.isa)
    assert identity == list(here.identity) and fingerprint == here.fingerprint
    assert fixed  # reading the identity fixed the ISA, so the fingerprint cannot go stale


@needs_avx512
def test_cpu_fingerprint_differs_by_isa():
    avx2, avx512 = _cpu_identity(AGENTKV_CPU_ISA="avx2"), _cpu_identity(AGENTKV_CPU_ISA="avx512")
    assert avx2[0][2] == "avx2" and avx512[0][2] == "avx512"
    assert avx2[0][3] == avx512[0][3]  # one kernel build
    assert avx2[1] != avx512[1]

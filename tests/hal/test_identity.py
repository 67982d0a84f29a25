"""Backend identity and fingerprint: what a cache of computed bits will be keyed by."""

from __future__ import annotations

import pytest

from agentkv.hal.base import BackendUnavailable, Identity, fingerprint_of
from agentkv.hal.kernels import build_id
from agentkv.hal.registry import lookup

AVAILABLE = ["reference", "cpu", "torch"]


def _backend(name):
    try:
        return lookup(name)
    except BackendUnavailable as e:
        pytest.skip(str(e))


def test_identities_name_what_computes_the_bits():
    assert lookup("reference").identity == Identity("reference", "cpu", None, None)
    assert lookup("torch").identity == Identity("torch", "cpu", None, None)
    cpu = _backend("cpu").identity
    assert cpu.name == "cpu" and cpu.device == "cpu" and cpu.isa in ("avx2", "avx512")
    assert cpu.kernel_build == build_id() and len(cpu.kernel_build) == 16


def test_fingerprints_differ_across_backends_and_are_stable():
    prints = {name: _backend(name).fingerprint for name in AVAILABLE}
    assert len(set(prints.values())) == len(prints), prints
    assert all(len(p) == 16 and int(p, 16) >= 0 for p in prints.values())
    assert prints == {name: lookup(name).fingerprint for name in AVAILABLE}  # a fresh instance agrees


def test_fingerprint_covers_every_identity_field_and_the_dtypes():
    base = Identity("cpu", "cpu", "avx2", "0123456789abcdef")
    variants = [
        base._replace(name="torch"),
        base._replace(device="cuda:0"),
        base._replace(isa="avx512"),
        base._replace(kernel_build="fedcba9876543210"),
        base._replace(isa=None),
    ]
    seen = {fingerprint_of(base, "f32", "f32")}
    seen |= {fingerprint_of(v, "f32", "f32") for v in variants}
    seen |= {fingerprint_of(base, "bf16", "f32"), fingerprint_of(base, "f32", "q8_0")}
    assert len(seen) == 1 + len(variants) + 2
    assert fingerprint_of(base, "f32", "f32") == fingerprint_of(Identity(*base), "f32", "f32")

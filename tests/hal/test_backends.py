"""Backends against the reference, and the batch-invariance every backend owes the cache."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from agentkv.hal.base import AttnMeta, KVSpec
from agentkv.hal.registry import backend_class, lookup
from agentkv.witness.ops import run_ops

BACKENDS = ["reference", "cpu", "torch"]


@pytest.fixture(scope="module", params=BACKENDS)
def backend(request):
    """`cpu` (the compiled kernels) and `torch`, the portable path (no compiled kernels:
    padded MKL GEMMs and 16-row attention tiles) that CUDA runs too."""
    return lookup(request.param)


def test_registry_classes():
    assert backend_class("reference") == "reference"
    assert backend_class("cpu") == backend_class("torch") == "approx"


def test_cpu_ops_witnessed_against_reference():
    rows = run_ops(lookup("cpu"), lookup("reference"))
    failed = [r for r in rows if r.status != "PASS"]
    assert not failed, failed
    assert len(rows) >= 25


def _rows_invariant(fn, x: np.ndarray) -> list[int]:
    """Row counts m for which fn(x[:m]) differs in any bit from fn(x)[:m]."""
    full = fn(x)
    return [m for m in (1, 2, 3, 5, 7, 11, 15, 16, 17, 31, 64) if not np.array_equal(fn(x[:m]), full[:m])]


def test_matmul_rows_are_batch_invariant(backend):
    rng = np.random.default_rng(0)
    w = backend.upload_weight("w", rng.standard_normal((384, 576)).astype(np.float32), 0, (384, 576))
    x = rng.standard_normal((100, 576)).astype(np.float32)
    assert _rows_invariant(lambda a: backend.read(backend.matmul(backend.upload(a), w)), x) == []


def test_elementwise_and_norms_are_batch_invariant(backend):
    rng = np.random.default_rng(1)
    g = backend.upload_weight("g", rng.standard_normal(1536).astype(np.float32), 0, (1536,))
    x = rng.standard_normal((70, 1536)).astype(np.float32)
    y = rng.standard_normal((70, 1536)).astype(np.float32)
    for kind in ("silu", "gelu_tanh", "gelu"):
        fn = lambda a, kind=kind: backend.read(backend.gated_act(backend.upload(a), backend.upload(y[: len(a)]), kind))  # noqa: E731
        assert _rows_invariant(fn, x) == [], kind
    fn = lambda a: backend.read(backend.rms_norm(backend.upload(a), g, 1e-5))  # noqa: E731
    assert _rows_invariant(fn, x) == []


def test_control_plain_linear_is_not_invariant():
    """The control: torch's unpadded f32 GEMM changes a row's bits with the row count, so the
    invariance test above would catch a backend that forgot to pad."""
    rng = np.random.default_rng(0)
    w = torch.from_numpy(rng.standard_normal((384, 576)).astype(np.float32))
    x = torch.from_numpy(rng.standard_normal((100, 576)).astype(np.float32))
    fn = lambda a: torch.nn.functional.linear(torch.from_numpy(a), w).numpy()  # noqa: E731
    assert _rows_invariant(fn, x.numpy()) != []


def _attend(be, q, kv, meta):
    return be.read(be.attention(be.upload(q), kv, 0, meta, 0.125))


def test_attention_decode_row_equals_prefill_row(backend):
    """A query at position p gives the same bits computed as a decode step, inside a long
    prefill chunk, or in a batch with unrelated sequences."""
    rng, bs, h, kvh, hd, n = np.random.default_rng(2), 16, 6, 2, 64, 45
    kv = backend.allocate_kv(KVSpec(1, 12, bs, kvh, hd))
    table = (3, 7, 1)
    slots = np.asarray(table)[np.arange(n) // bs] * bs + np.arange(n) % bs
    backend.kv_store(
        kv,
        0,
        backend.upload(rng.standard_normal((n, kvh, hd))),
        backend.upload(rng.standard_normal((n, kvh, hd))),
        slots,
    )
    q = rng.standard_normal((n, h, hd)).astype(np.float32)
    pos = np.arange(n, dtype=np.int64)
    zeros = np.zeros(n, np.int64)
    prefill = _attend(backend, q, kv, AttnMeta((n,), (n,), (table,), pos, zeros))
    for p in (0, 15, 16, 30, 44):
        decode = _attend(backend, q[p : p + 1], kv, AttnMeta((1,), (p + 1,), (table,), pos[p : p + 1], zeros[:1]))
        assert np.array_equal(decode[0], prefill[p]), p
    # chunk [20, 33) of the prompt, batched after an unrelated sequence of 9 rows
    other_table = (9, 10)
    backend.kv_store(
        kv,
        0,
        backend.upload(rng.standard_normal((20, kvh, hd))),
        backend.upload(rng.standard_normal((20, kvh, hd))),
        np.asarray(other_table)[np.arange(20) // bs] * bs + np.arange(20) % bs,
    )
    qo = rng.standard_normal((9, h, hd)).astype(np.float32)
    meta = AttnMeta(
        (9, 13),
        (20, 33),
        (other_table, table),
        np.concatenate([np.arange(11, 20), np.arange(20, 33)]),
        np.zeros(22, np.int64),
    )
    mixed = _attend(backend, np.concatenate([qo, q[20:33]]), kv, meta)
    assert np.array_equal(mixed[9:], prefill[20:33])


def test_torch_pure_attention_path_matches_kernel_path():
    """The `torch` backend's tiled attention (no compiled kernels, and the one CUDA runs) is
    itself witnessed against the reference."""
    rows = [r for r in run_ops(lookup("torch"), lookup("reference")) if r.op.startswith("attention")]
    assert rows and all(r.status == "PASS" for r in rows), rows


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_backend_witnessed():
    rows = run_ops(lookup("torch-cuda"), lookup("reference"))
    assert all(r.status == "PASS" for r in rows), [r for r in rows if r.status != "PASS"]


def test_kv_copy_blocks(backend):
    kv = backend.allocate_kv(KVSpec(2, 4, 4, 1, 8))
    rng = np.random.default_rng(3)
    k = rng.standard_normal((4, 1, 8)).astype(np.float32)
    for layer in range(2):
        backend.kv_store(kv, layer, backend.upload(k), backend.upload(-k), np.arange(4, 8))
    backend.copy_blocks(kv, [(1, 3)])
    meta = AttnMeta((1,), (4,), ((3,),), np.array([3]), np.zeros(1, np.int64))
    meta_src = AttnMeta((1,), (4,), ((1,),), np.array([3]), np.zeros(1, np.int64))
    q = rng.standard_normal((1, 1, 8)).astype(np.float32)
    assert np.array_equal(_attend(backend, q, kv, meta), _attend(backend, q, kv, meta_src))
    assert not math.isnan(float(_attend(backend, q, kv, meta).sum()))

"""The f16 KV store: every backend rounds K/V as torch's `.to(float16)` does (to nearest even,
subnormals, overflow to inf), the compiled store (F16C) gives the same bits, attention reads
the rounded values exactly (the witness floor fails a reference that kept f32), and the store
is half the bytes, copies and round-trips them, and refuses a dtype it was not set to."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from agentkv.hal.base import AttnMeta, KVSpec
from agentkv.hal.registry import lookup
from agentkv.witness.ops import COSINE_FLOOR_KV_F16, _attention_cases, attention_case, compare, with_kv_dtype
from tests.hal.conftest import K

BACKENDS = ["cpu", "torch", "reference"]
F16_MAX = 65504.0


def awkward_values(count: int, seed: int) -> np.ndarray:
    """f32 values that make rounding to f16 hard: random bit patterns over the whole finite
    range, exact halfway points between neighbouring f16 values (normal and subnormal) and
    their f32 neighbours, the overflow edge and signed zeros and infinities."""
    rng = np.random.default_rng(seed)
    bits = rng.integers(0, 1 << 32, count, dtype=np.uint64).astype(np.uint32)
    rand = bits.view(np.float32)
    rand = rand[np.isfinite(rand)]
    lo = rng.integers(0, 0x7BFF, count // 4).astype(np.uint16)  # f16 values below the largest
    a = lo.view(np.float16).astype(np.float32)
    b = (lo + 1).view(np.float16).astype(np.float32)
    halfway = (a.astype(np.float64) + b) / 2  # exact in f32: f16 has 11 significant bits
    halfway = halfway.astype(np.float32)
    near = np.concatenate([np.nextafter(halfway, np.float32(-np.inf)), np.nextafter(halfway, np.float32(np.inf))])
    edges = np.array(
        [0.0, -0.0, np.inf, -np.inf, F16_MAX, 65519.99, 65520.0, 1e9, 2.0**-24, 2.0**-25, 2.0**-26, 6.0e-8, 1e-30],
        np.float32,
    )
    values = np.concatenate([rand, halfway, near, edges, -halfway, -edges])
    return values.astype(np.float32)


def torch_half_bits(x: np.ndarray) -> np.ndarray:
    return torch.from_numpy(np.ascontiguousarray(x, np.float32)).to(torch.float16).numpy().view(np.uint16)


def stored_half_bits(kv, layer: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(K, V) of one layer as f16 bits, slot-major `[slots, kvh * hd]`."""
    out = []
    for store in (kv.k, kv.v):
        arr = store[layer].numpy() if isinstance(store, torch.Tensor) else store[layer]
        assert arr.dtype == np.float16
        out.append(np.asarray(arr).reshape(-1, kv.spec.num_kv_heads * kv.spec.head_dim).view(np.uint16))
    return out[0], out[1]


def test_the_halfway_values_really_are_halfway():
    """Control for awkward_values: half of the halfway points round up and half down (to the
    even neighbour), so a round-half-up store would differ from torch on about half of them."""
    lo = np.arange(1, 0x7BFF, 2, dtype=np.uint16)  # odd f16 codes: ties round away from them
    a, b = lo.view(np.float16).astype(np.float64), (lo + 1).view(np.float16).astype(np.float64)
    halfway = ((a + b) / 2).astype(np.float32)
    assert np.array_equal(torch_half_bits(halfway), lo + 1)
    assert not np.array_equal(torch_half_bits(halfway), lo)


@pytest.mark.parametrize("backend", BACKENDS)
def test_kv_store_rounds_to_f16_as_torch_does(backend):
    be = lookup(backend).set_kv_dtype("f16")
    values = awkward_values(4096, seed=1)
    kvh, hd = 2, 8
    n = len(values) // (kvh * hd)
    k = values[: n * kvh * hd].reshape(n, kvh, hd)
    v = np.ascontiguousarray(-k[::-1])
    kv = be.allocate_kv(KVSpec(1, -(-n // 16) + 1, 16, kvh, hd, "f16"))
    slots = np.arange(16, 16 + n)
    be.kv_store(kv, 0, be.upload(k), be.upload(v), slots)
    got_k, got_v = stored_half_bits(kv)
    assert np.array_equal(got_k[slots], torch_half_bits(k.reshape(n, -1)))
    assert np.array_equal(got_v[slots], torch_half_bits(v.reshape(n, -1)))
    assert not got_k[:16].any()  # untouched slots stay zero


@pytest.mark.skipif(K is None, reason="the cpu kernels cannot run here")
def test_the_compiled_store_rounds_like_torch(isa, threads):
    """attention_inputs (the store of the one-call decoder block) converts with F16C /
    AVX-512: V rows are stored as they come, and so are K's dims past rope_dim (rope_dim=2);
    both must hold torch's bits, the vector body and the scalar tail (kvh * hd = 3 * 12)."""
    n, h, kvh, hd = 200, 2, 3, 12
    values = np.resize(awkward_values(2000, seed=2), n * kvh * hd)
    qkv = np.zeros((n, (h + 2 * kvh) * hd), np.float32)
    qkv[:, h * hd : (h + kvh) * hd] = np.where(np.isfinite(values), values, 1.0).reshape(n, -1)
    qkv[:, (h + kvh) * hd :] = values.reshape(n, -1)
    k_cache = torch.zeros((n + 5, kvh, hd), dtype=torch.float16)
    v_cache = torch.zeros_like(k_cache)
    slots = torch.arange(5, n + 5)
    cos, sin = torch.ones((1, 1)), torch.zeros((1, 1))
    K.attention_inputs(
        torch.from_numpy(qkv), None, None, cos, sin, torch.zeros(n, dtype=torch.int64), slots,
        k_cache, v_cache, h, kvh, 2, False, 1e-6,
    )  # fmt: skip
    want_v = torch_half_bits(qkv[:, (h + kvh) * hd :])
    got_v = v_cache.numpy()[5:].reshape(n, -1).view(np.uint16)
    assert np.array_equal(got_v, want_v)
    want_k = torch_half_bits(qkv[:, h * hd : (h + kvh) * hd]).reshape(n, kvh, hd)[:, :, 2:]
    assert np.array_equal(k_cache.numpy()[5:].view(np.uint16)[:, :, 2:], want_k)


def f16_attention_rows(backend: str) -> list:
    be, ref = lookup(backend), lookup("reference")
    rows = []
    for op, shape, fn, floor, _ in _attention_cases():
        if op == "attention/kv=f16":
            rows.append(compare(op, shape, fn(ref), fn(be), floor))
    return rows


@pytest.mark.parametrize("backend", ["cpu", "torch"])
def test_f16_attention_matches_the_reference_within_its_floor(backend, isa):
    rows = f16_attention_rows(backend)
    assert len(rows) == 3 and all(r.floor == COSINE_FLOOR_KV_F16 for r in rows)
    assert all(r.status == "PASS" for r in rows), rows


def test_control_a_reference_that_kept_f32_kv_fails_the_f16_floor():
    """The floor can fail: the same f16 attention against a reference holding f32 K/V misses it
    by orders of magnitude, though it would pass the f32 floor."""
    cpu, ref = lookup("cpu"), lookup("reference")
    for h, kvh, hd, lens in [(9, 3, 64, [37, 600]), (4, 1, 256, [300])]:
        case = (6, (h, kvh, hd), lens, None, None)
        got = with_kv_dtype(cpu, "f16", lambda case=case: attention_case(cpu, *case))
        row = compare("attention", "", attention_case(ref, *case), got, COSINE_FLOOR_KV_F16)
        assert row.status == "FAIL" and 1 - row.cosine > 100 * (1 - COSINE_FLOOR_KV_F16)
        assert row.cosine > 0.9999


@pytest.mark.parametrize("backend", BACKENDS)
def test_block_io_and_copy_on_write_keep_f16_bits(backend):
    be = lookup(backend).set_kv_dtype("f16")
    spec = KVSpec(2, 4, 3, 2, 5, "f16")
    kv = be.allocate_kv(spec)
    rng = np.random.default_rng(3)
    for layer in range(2):
        k, v = (rng.standard_normal((12, 2, 5)).astype(np.float32) for _ in range(2))
        be.kv_store(kv, layer, be.upload(k), be.upload(v), np.arange(12))
    data = be.read_block(kv, 1)
    assert len(data) == spec.bytes_per_block == 2 * 2 * 3 * 2 * 5 * 2
    layout = np.frombuffer(data, "<f2").reshape(2, 2, 3, 2, 5)
    assert np.array_equal(layout[0, 0].view(np.uint16), stored_half_bits(kv, 0)[0][3:6].reshape(3, 2, 5))
    be.write_block(kv, 3, data)
    assert be.read_block(kv, 3) == data
    be.copy_blocks(kv, [(1, 0)])
    assert be.read_block(kv, 0) == data


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_store_of_another_dtype_than_the_backend_is_refused(backend):
    be = lookup(backend)
    assert be.kv_dtype == "f32"
    with pytest.raises(ValueError, match=r"KVSpec.dtype='f16' but backend .* kv_dtype='f32'"):
        be.allocate_kv(KVSpec(1, 2, 16, 1, 8, "f16"))
    be.set_kv_dtype("f16")
    with pytest.raises(ValueError, match=r"KVSpec.dtype='f32' but backend .* kv_dtype='f16'"):
        be.allocate_kv(KVSpec(1, 2, 16, 1, 8))


def test_bad_kv_dtypes_are_named():
    with pytest.raises(ValueError, match=r"KVSpec.dtype='bf16' is not allowed: use one of 'f32', 'f16'"):
        KVSpec(1, 2, 16, 1, 8, "bf16")
    with pytest.raises(ValueError, match=r"kv_dtype='float16' is not allowed"):
        lookup("reference").set_kv_dtype("float16")


def test_f16_halves_the_bytes_and_changes_the_fingerprint():
    f32, f16 = KVSpec(30, 1, 16, 3, 64), KVSpec(30, 1, 16, 3, 64, "f16")
    assert f32.bytes_per_token == 46080 and f16.bytes_per_token == 23040
    assert f16.bytes_per_block * 2 == f32.bytes_per_block
    a, b = lookup("cpu"), lookup("cpu").set_kv_dtype("f16")
    assert a.identity == b.identity and a.fingerprint != b.fingerprint


@pytest.mark.parametrize("hd", [64, 256, 20])
def test_attention_reads_exactly_the_stored_f16_values(isa, threads, hd):
    """Attention over an f16 store equals attention over an f32 store holding the same
    (already rounded) values, bit for bit: the widening is exact and the arithmetic after it
    is the f32 kernel's. hd 20 takes both builds' partial-chunk loads (8 + 8 + 4, 16 + 4)."""
    cpu32, cpu16 = lookup("cpu"), lookup("cpu").set_kv_dtype("f16")
    rng = np.random.default_rng(4)
    n, h, kvh, bs = 520, 6, 2, 16
    k, v = (rng.standard_normal((n, kvh, hd)).astype(np.float16).astype(np.float32) for _ in range(2))
    q = rng.standard_normal((3, h, hd)).astype(np.float32)
    table = tuple(range(1, math.ceil(n / bs) + 1))
    slots = np.arange(bs, bs + n)
    meta = AttnMeta((3,), (n,), (table,), np.arange(n - 3, n), slots[-3:])
    outs = []
    for be, dtype in ((cpu32, "f32"), (cpu16, "f16")):
        kv = be.allocate_kv(KVSpec(1, len(table) + 1, bs, kvh, hd, dtype))
        be.kv_store(kv, 0, be.upload(k), be.upload(v), slots)
        outs.append(be.read(be.attention(be.upload(q), kv, 0, meta, 0.125)))
    assert np.array_equal(outs[0], outs[1])

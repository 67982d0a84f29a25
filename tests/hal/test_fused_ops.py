"""The fused glue ops (rms_norm, add_norm, glu, attention_inputs): the cpu backend's compiled
kernels against the reference backend's default composition, exact batch and thread-count
invariance, and a control that shows the invariance check can fail."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from agentkv.hal.base import AttnMeta, BackendUnavailable, KVSpec, RopeSpec, RopeStyle
from agentkv.hal.blocks import AttentionSpec
from agentkv.hal.cpu import CpuBackend
from agentkv.hal.kernels import load
from agentkv.hal.reference import ReferenceBackend

try:
    T, R = CpuBackend(), ReferenceBackend()
except BackendUnavailable as e:
    pytest.skip(f"the cpu backend cannot run here: {e}", allow_module_level=True)

# Tolerance against the reference. Both sides are float32 with different (each fixed)
# orders: the kernel's 8-lane sum of squares vs numpy's pairwise sum (relative error
# ~sqrt(d) * 2^-24 typical, d * 2^-24 = 1e-4 at worst for d = 1536, halved by the sqrt);
# exp8 (about 1 ulp) vs numpy's exp; gelu_tanh as x / (1 + exp(-2y)) vs the reference's
# 0.5 x (1 + tanh y), which itself loses up to ~2^-24 / (1 + tanh y) relative where tanh y
# is near -1 (there the output is tiny, so its error is small against the largest output).
# Hence: cosine >= 0.99999 and max |error| <= 2e-5 of the largest |reference output|.
COSINE_FLOOR, MAX_REL = 0.99999, 2e-5


def assert_close(ours: np.ndarray, ref: np.ndarray):
    a, b = ours.astype(np.float64).ravel(), ref.astype(np.float64).ravel()
    cos = a @ b / (np.linalg.norm(a) * np.linalg.norm(b))
    rel = np.abs(a - b).max() / np.abs(b).max()
    assert cos >= COSINE_FLOOR and rel <= MAX_REL, (cos, rel)


def weight(be, data: np.ndarray, name: str = "w"):
    data = np.asarray(data, np.float32)
    return be.upload_weight(name, data, 0, data.shape)


def rows_differing(fn, x: np.ndarray) -> list[int]:
    """Row counts m for which fn(x[:m]) differs in any bit from fn(x)[:m]."""
    full = fn(x)
    return [m for m in (1, 2, 3, 5, 7, 11, 16, 17, 31, 64) if not np.array_equal(fn(x[:m]), full[:m])]


# ---------------------------------------------------------------- rms_norm, add_norm, glu


@pytest.mark.parametrize("shape", [(1, 576), (9, 640), (3, 33), (5, 3, 64)])
@pytest.mark.parametrize("unit_offset", [False, True])
def test_rms_norm_matches_reference(shape, unit_offset):
    rng = np.random.default_rng(len(shape) + shape[-1])
    x, w = rng.standard_normal(shape), rng.standard_normal(shape[-1])
    out = [be.read(be.rms_norm(be.upload(x), weight(be, w), 1e-6, unit_offset)) for be in (T, R)]
    assert out[0].shape == shape
    assert_close(*out)


@pytest.mark.parametrize("d", [576, 33])
@pytest.mark.parametrize("post", [False, True], ids=["llama", "sandwich"])
@pytest.mark.parametrize("unit_offset", [False, True])
def test_add_norm_matches_reference(d, post, unit_offset):
    rng = np.random.default_rng(d)
    h, delta = rng.standard_normal((7, d)), rng.standard_normal((7, d)) * 3
    w, pw = rng.standard_normal(d), rng.standard_normal(d)
    outs = []
    for be in (T, R):
        post_w = weight(be, pw, "post") if post else None
        h_new, normed = be.add_norm(be.upload(h), be.upload(delta), weight(be, w), 1e-6, unit_offset, post_w)
        outs.append((be.read(h_new), be.read(normed)))
    assert_close(outs[0][0], outs[1][0])
    assert_close(outs[0][1], outs[1][1])


@pytest.mark.parametrize("kind", ["silu", "gelu_tanh", "gelu"])
@pytest.mark.parametrize("f", [1536, 37])
def test_glu_matches_reference(kind, f):
    rng = np.random.default_rng(f)
    x = rng.standard_normal((5, 2 * f)) * 3
    assert_close(T.read(T.glu(T.upload(x), kind)), R.read(R.glu(R.upload(x), kind)))
    # the unfused pair form gives the same function
    pair = [T.upload(x[:, :f]), T.upload(x[:, f:])]
    assert_close(T.read(T.glu(pair, kind)), R.read(R.glu(R.upload(x), kind)))


def test_glu_extremes_stay_finite():
    """exp8 clamps its argument: huge |gate| gives silu/gelu's limits (x or 0), never nan."""
    x = np.array([[-1e30, -200.0, -90.0, 0.0, 90.0, 200.0, 1e30, 1.0] + [1.0] * 8], np.float32)
    for kind in ("silu", "gelu_tanh"):
        out = T.read(T.glu(T.upload(x), kind))[0]
        assert np.all(np.isfinite(out)), (kind, out)
        np.testing.assert_allclose(out[3:7], [0.0, 90.0, 200.0, 1e30], rtol=1e-6)
        assert np.all(np.abs(out[:3]) < 1e-8), (kind, out)  # -1e30 / exp(88.4) = -4e-9


def test_norms_and_glu_are_batch_invariant():
    rng = np.random.default_rng(3)
    x, y = rng.standard_normal((70, 1536)), rng.standard_normal((70, 1536))
    g, pg = weight(T, rng.standard_normal(1536)), weight(T, rng.standard_normal(1536))
    assert rows_differing(lambda a: T.read(T.rms_norm(T.upload(a), g, 1e-6, True)), x) == []
    for kind in ("silu", "gelu_tanh"):
        assert rows_differing(lambda a, kind=kind: T.read(T.glu(T.upload(a), kind)), x) == [], kind

    def add_norm(a, post):
        h_new, normed = T.add_norm(T.upload(a), T.upload(y[: len(a)]), g, 1e-6, False, post)
        return np.concatenate([T.read(h_new), T.read(normed)], axis=1)

    assert rows_differing(lambda a: add_norm(a, None), x) == []
    assert rows_differing(lambda a: add_norm(a, pg), x) == []


def test_control_gemm_sum_of_squares_is_not_invariant():
    """The control: an RMSNorm whose sum of squares runs through torch's unpadded GEMM changes
    a row's bits with the row count, so the check above catches a batch-dependent order."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((100, 1536)).astype(np.float32)
    ones = torch.ones(1, 1536)

    def gemm_rms(a):
        t = torch.from_numpy(a)
        ms = torch.nn.functional.linear(t * t, ones) / 1536
        return (t / torch.sqrt(ms + 1e-6)).numpy()

    assert rows_differing(gemm_rms, x) != []


def test_thread_count_invariance():
    rng = np.random.default_rng(4)
    x, y = rng.standard_normal((300, 576)), rng.standard_normal((300, 576))
    g = weight(T, rng.standard_normal(576))
    qkv = rng.standard_normal((300, (9 + 2 * 3) * 64))

    def run_all():
        h_new, normed = T.add_norm(T.upload(x), T.upload(y), g, 1e-6, False, g)
        q, k, v = attention_inputs(
            T, qkv, np.arange(300) * 7, np.arange(300)[::-1].copy(), 9, 3, 64, RopeSpec(dim=64), norms=True
        )
        return [
            T.read(T.rms_norm(T.upload(x), g, 1e-6)),
            T.read(T.glu(T.upload(x), "gelu_tanh")),
            T.read(h_new),
            T.read(normed),
            q,
            k,
            v,
        ]

    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = run_all()
        torch.set_num_threads(2)
        two = run_all()
    finally:
        torch.set_num_threads(before)
    for a, b in zip(one, two):
        assert np.array_equal(a, b)


# ---------------------------------------------------------------- attention_inputs

NUM_SLOTS_BLOCKS, BLOCK = 20, 16


def attention_inputs(
    be, qkv: np.ndarray, positions, slots, h, kvh, hd, rope: RopeSpec, norms=False, unit_offset=False, unfused=False
):
    """Runs the op on a fresh KV store; returns (q, K rows, V rows) at `slots`, as arrays."""
    n = len(qkv)
    kv = be.allocate_kv(KVSpec(1, NUM_SLOTS_BLOCKS, BLOCK, kvh, hd))
    meta = AttnMeta((n,), (n,), ((0,),), np.asarray(positions, np.int64), np.asarray(slots, np.int64))
    rng = np.random.default_rng(hd)
    q_norm = weight(be, rng.standard_normal(hd), "qn") if norms else None
    k_norm = weight(be, rng.standard_normal(hd), "kn") if norms else None
    x = be.upload(qkv)
    if unfused:
        x = [be.upload(p) for p in np.split(qkv, [h * hd, (h + kvh) * hd], axis=1)]
    q = be.attention_inputs(
        x, meta, kv, 0, AttentionSpec(h, kvh, hd, rope, eps=1e-6, unit_offset=unit_offset), q_norm, k_norm
    )
    k_all = np.asarray(kv.k[0]).reshape(-1, kvh, hd)
    v_all = np.asarray(kv.v[0]).reshape(-1, kvh, hd)
    return be.read(q), k_all[np.asarray(slots)].copy(), v_all[np.asarray(slots)].copy()


CASES = {  # name: (h, kvh, hd, rope)
    "neox": (4, 2, 64, RopeSpec(dim=64, style=RopeStyle.NEOX)),
    "interleaved": (4, 2, 64, RopeSpec(dim=64, style=RopeStyle.INTERLEAVED)),
    "partial-neox": (3, 1, 40, RopeSpec(dim=24, style=RopeStyle.NEOX)),
    "partial-interleaved": (3, 1, 40, RopeSpec(dim=24, style=RopeStyle.INTERLEAVED)),
    "llama3-scaled": (
        9,
        3,
        64,
        RopeSpec(
            dim=64,
            theta=500000.0,
            style=RopeStyle.INTERLEAVED,
            scaling={"type": "llama3", "factor": 8.0, "original_max_position_embeddings": 64},
        ),
    ),
}


def random_rows(n: int, h: int, kvh: int, hd: int, seed: int):
    rng = np.random.default_rng(seed)
    qkv = rng.standard_normal((n, (h + 2 * kvh) * hd)) * 2
    positions = rng.integers(0, 6000, n)  # past the 4096-row first table: it grows
    slots = rng.permutation(NUM_SLOTS_BLOCKS * BLOCK)[:n]
    return qkv, positions, slots


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize(
    "norms,unit_offset", [(False, False), (True, False), (True, True)], ids=["plain", "qk-norm", "qk-norm-unit-offset"]
)
def test_attention_inputs_match_reference(case, norms, unit_offset):
    h, kvh, hd, rope = CASES[case]
    qkv, positions, slots = random_rows(13, h, kvh, hd, seed=hd + h)
    ours = attention_inputs(T, qkv, positions, slots, h, kvh, hd, rope, norms, unit_offset)
    ref = attention_inputs(R, qkv, positions, slots, h, kvh, hd, rope, norms, unit_offset)
    for a, b in zip(ours, ref):
        assert_close(a, b)
    assert np.array_equal(ours[2], ref[2])  # V is stored as it came
    if not norms:  # rope alone is the same arithmetic, element for element
        assert np.array_equal(ours[0], ref[0]) and np.array_equal(ours[1], ref[1])


@pytest.mark.parametrize("case", ["neox", "partial-interleaved"])
def test_attention_inputs_unfused_parts_match(case):
    h, kvh, hd, rope = CASES[case]
    qkv, positions, slots = random_rows(6, h, kvh, hd, seed=5)
    fused = attention_inputs(T, qkv, positions, slots, h, kvh, hd, rope, norms=True)
    parts = attention_inputs(T, qkv, positions, slots, h, kvh, hd, rope, norms=True, unfused=True)
    ref = attention_inputs(R, qkv, positions, slots, h, kvh, hd, rope, norms=True, unfused=True)
    for a, b, c in zip(fused, parts, ref):
        assert_close(a, c)
        assert_close(b, c)


@pytest.mark.parametrize("case", ["interleaved", "partial-neox"])
def test_attention_inputs_batch_invariant(case, threads):
    """A row alone, or the first m rows, give the same bits for q and the stored K/V as the
    same rows inside the whole batch."""
    h, kvh, hd, rope = CASES[case]
    qkv, positions, slots = random_rows(64, h, kvh, hd, seed=9)
    full = attention_inputs(T, qkv, positions, slots, h, kvh, hd, rope, norms=True, unit_offset=True)
    for m in (1, 2, 3, 7, 17, 31):
        part = attention_inputs(T, qkv[:m], positions[:m], slots[:m], h, kvh, hd, rope, norms=True, unit_offset=True)
        for a, b in zip(part, full):
            assert np.array_equal(a, b[:m]), m
    alone = attention_inputs(
        T, qkv[40:41], positions[40:41], slots[40:41], h, kvh, hd, rope, norms=True, unit_offset=True
    )
    for a, b in zip(alone, full):
        assert np.array_equal(a[0], b[40])


# ---------------------------------------------------------------- bad shapes


def test_bad_shapes_name_the_value():
    K = load()
    x, w = torch.zeros(2, 10), torch.zeros(9)
    with pytest.raises(RuntimeError, match="weight has 9 entries, expected d=10"):
        K.rms_norm(x, w, 1e-6)
    with pytest.raises(RuntimeError, match=r"delta has shape \[2, 9\]"):
        K.add_norm(x, torch.zeros(2, 9), torch.zeros(10), None, 1e-6)
    with pytest.raises(RuntimeError, match="x has 7 columns"):
        K.glu(torch.zeros(2, 7), 0)
    with pytest.raises(RuntimeError, match="glu kind 5"):
        K.glu(torch.zeros(2, 8), 5)
    with pytest.raises(ValueError, match="width must be even, got 7"):
        R.glu(R.upload(np.zeros((2, 7))), "silu")
    h, kvh, hd, rope = CASES["neox"]
    qkv, positions, slots = random_rows(3, h, kvh, hd, seed=1)
    for be in (T, R):  # the kernel's check (RuntimeError) or the composed default's (ValueError)
        with pytest.raises((RuntimeError, ValueError), match="qkv has 100 columns, expected .* 512"):
            attention_inputs(be, qkv[:, :100], positions, slots, h, kvh, hd, rope)
    kv_k, cos = torch.zeros(320, kvh, hd), torch.zeros(4096, 32)
    x = torch.from_numpy(qkv.astype(np.float32))

    def raw_inputs(positions: list[int], slots: list[int], rope_dim: int) -> None:
        args = (None, None, cos, cos, torch.tensor(positions), torch.tensor(slots), kv_k, kv_k.clone())
        K.attention_inputs(x, *args, h, kvh, rope_dim, False, 1e-6)

    with pytest.raises(RuntimeError, match=r"positions\[2\]=4096 out of range \[0, num_pos=4096\)"):
        raw_inputs([0, 1, 4096], [0, 1, 2], 64)
    with pytest.raises(RuntimeError, match=r"slots\[1\]=-1 out of range"):
        raw_inputs([0, 1, 2], [0, -1, 2], 64)
    with pytest.raises(RuntimeError, match="rope_dim=66 must be even and in"):
        raw_inputs([0, 1, 2], [0, 1, 2], 66)

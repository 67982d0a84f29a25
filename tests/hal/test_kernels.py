"""The compiled CPU kernels: accuracy against float64 oracles (gguf-py for dequantization)
and batch invariance proven with exact equality, plus a control that shows it can fail."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from agentkv.hal.base import BackendUnavailable
from agentkv.hal.kernels import QTYPE_BLOCK, load, row_bytes, unavailable_reason

gguf = pytest.importorskip("gguf")
try:
    K = load()
except BackendUnavailable as e:
    pytest.skip(f"agentkv CPU kernels unavailable here: {e}", allow_module_level=True)

QTYPES = {"Q4_0": 2, "Q4_1": 3, "Q5_0": 6, "Q5_1": 7, "Q8_0": 8, "Q4_K": 12, "Q5_K": 13, "Q6_K": 14}
LEGACY = {"Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"}


# ---------------------------------------------------------------- quantized weights


def random_quant(name: str, n: int, k: int, seed: int) -> np.ndarray:
    """[n, row_bytes] uint8 in the exact GGUF layout. Legacy types go through gguf's own
    quantizer; K-quants are random bytes with finite, modest f16 super-block scales."""
    rng = np.random.default_rng(seed)
    qtype = QTYPES[name]
    if name in LEGACY:
        w = rng.standard_normal((n, k)).astype(np.float32)
        return gguf.quants.quantize(w, gguf.GGMLQuantizationType(qtype))
    qk, nbytes = QTYPE_BLOCK[qtype]
    blocks = rng.integers(0, 256, size=(n * k // qk, nbytes), dtype=np.uint8)
    scales = rng.uniform(1e-3, 2e-2, size=(blocks.shape[0], 2)).astype(np.float16).view(np.uint8)
    if name == "Q6_K":
        blocks[:, 208:210] = scales[:, :2]
    else:
        blocks[:, 0:4] = scales  # d, dmin
    return blocks.reshape(n, row_bytes(qtype, k))


def gguf_dequant(w: np.ndarray, name: str) -> np.ndarray:
    return gguf.quants.dequantize(w, gguf.GGMLQuantizationType(QTYPES[name]))


@pytest.mark.parametrize("name", QTYPES)
def test_dequantize_is_bit_identical_to_gguf(name):
    n, k = 5, 512
    w = random_quant(name, n, k, seed=1)
    ours = K.dequantize(torch.from_numpy(w), QTYPES[name], n, k)
    assert torch.equal(ours, torch.from_numpy(gguf_dequant(w, name).astype(np.float32)))


@pytest.mark.parametrize("name", ["Q5_0", "Q5_1"])
def test_q5_random_blocks_dequantize_bit_identical(name):
    """Every qh bit pattern (random bytes, not just what gguf's quantizer emits) lands on the
    right weight: weight i's fifth bit is bit i of the little-endian u32 qh."""
    qtype = QTYPES[name]
    qk, nbytes = QTYPE_BLOCK[qtype]
    n, k = 7, 256
    rng = np.random.default_rng(21)
    blocks = rng.integers(0, 256, size=(n * k // qk, nbytes), dtype=np.uint8)
    nscales = 1 if name == "Q5_0" else 2
    blocks[:, : 2 * nscales] = (
        rng.uniform(-2e-2, 2e-2, size=(blocks.shape[0], nscales)).astype(np.float16).view(np.uint8)
    )
    w = blocks.reshape(n, row_bytes(qtype, k))
    ours = K.dequantize(torch.from_numpy(w), qtype, n, k)
    assert torch.equal(ours, torch.from_numpy(gguf_dequant(w, name).astype(np.float32)))


# f32 accumulation over k=512 terms: the error is ~sqrt(k) * 2^-24 * max|term|; bounded by
# 1e-5 of the largest |output| with a wide margin, and cosine far above 0.99999.
MAX_REL = 1e-5
MIN_COS = 0.99999


def check_close(ours: torch.Tensor, ref: np.ndarray):
    got = ours.double().numpy()
    cos = (got * ref).sum() / np.sqrt((got * got).sum() * (ref * ref).sum())
    assert cos >= MIN_COS
    assert np.abs(got - ref).max() <= MAX_REL * np.abs(ref).max()


@pytest.mark.parametrize("name", QTYPES)
@pytest.mark.parametrize("m", [1, 2, 3, 4, 5, 13])
def test_qmatmul_matches_float64_oracle(name, m, isa):
    n, k = 67, 512
    w = random_quant(name, n, k, seed=2)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(3))
    ref = x.double().numpy() @ gguf_dequant(w, name).astype(np.float64).T
    check_close(K.qmatmul(x, torch.from_numpy(w), QTYPES[name], n, k), ref)


@pytest.mark.parametrize("name", QTYPES)
def test_qmatmul_rows_are_batch_invariant(name, threads, isa):
    n, k = 61, 256 if name in LEGACY else 512
    w = torch.from_numpy(random_quant(name, n, k, seed=4))
    x = torch.randn(64, k, generator=torch.Generator().manual_seed(5))
    full = K.qmatmul(x, w, QTYPES[name], n, k)
    for lo, hi in [(0, 1), (9, 10), (0, 2), (5, 8), (3, 7), (20, 27), (1, 64), (7, 12)]:
        assert torch.equal(K.qmatmul(x[lo:hi].contiguous(), w, QTYPES[name], n, k), full[lo:hi]), (lo, hi)
    # a row alone equals itself next to unrelated rows in any order
    perm = torch.randperm(64, generator=torch.Generator().manual_seed(6))
    assert torch.equal(K.qmatmul(x[perm].contiguous(), w, QTYPES[name], n, k), full[perm])


@pytest.mark.parametrize("int8", [False, True], ids=["f32", "int8"])
@pytest.mark.parametrize("name", ["Q4_1", "Q5_0", "Q6_K"])
def test_qmatmul_bits_do_not_depend_on_thread_count(name, isa, int8):
    """Big enough (>= 64 KiB of weights per task) that the decode GEMV really splits columns
    across threads; every m path (1..4 decode, >4 prefill) against one thread; int8: the
    int8-activation kernels (qmatmul int8=True) too."""
    n, k = 1030, 512
    w = torch.from_numpy(random_quant(name, n, k, seed=9))
    x = torch.randn(9, k, generator=torch.Generator().manual_seed(10))
    before = torch.get_num_threads()
    try:
        outs = {}
        for t in (1, 2):
            torch.set_num_threads(t)
            outs[t] = [K.qmatmul(x[:m].contiguous(), w, QTYPES[name], n, k, int8=int8) for m in (1, 2, 3, 4, 9)]
    finally:
        torch.set_num_threads(before)
    for one, two in zip(outs[1], outs[2]):
        assert torch.equal(one, two)
        assert torch.equal(one, outs[1][-1][: one.shape[0]])


@pytest.mark.parametrize("name", ["Q4_1", "Q5_0", "Q6_K"])
def test_qmatmul_long_rows_are_accurate_and_invariant(name, isa):
    """k >= 1024 takes the k-blocked prefill sweep (AVX-512): still the oracle's values, and
    a row alone (decode path) still equals that row among 13 (prefill path)."""
    n, k = 29, 1536
    w = torch.from_numpy(random_quant(name, n, k, seed=13))
    x = torch.randn(13, k, generator=torch.Generator().manual_seed(14))
    full = K.qmatmul(x, w, QTYPES[name], n, k)
    check_close(full, x.double().numpy() @ gguf_dequant(w.numpy(), name).astype(np.float64).T)
    for lo, hi in [(0, 1), (12, 13), (3, 5), (2, 9)]:
        assert torch.equal(K.qmatmul(x[lo:hi].contiguous(), w, QTYPES[name], n, k), full[lo:hi]), (lo, hi)


def test_qmatmul_invariance_control_can_fail(isa):
    """The invariance checks compare exact bits; one changed input bit must show."""
    name, n, k = "Q4_1", 16, 256
    w = torch.from_numpy(random_quant(name, n, k, seed=7))
    x = torch.randn(8, k, generator=torch.Generator().manual_seed(8))
    full = K.qmatmul(x, w, QTYPES[name], n, k)
    x2 = x.clone()
    x2[3, 17] = torch.nextafter(x2[3, 17], torch.tensor(float("inf")))
    assert not torch.equal(K.qmatmul(x2[3:4].contiguous(), w, QTYPES[name], n, k), full[3:4])


@pytest.mark.parametrize("k", [64, 100, 576])
def test_matmul_f32_matches_and_is_row_invariant(k, threads, isa):
    n = 37
    g = torch.Generator().manual_seed(k)
    x, w = torch.randn(40, k, generator=g), torch.randn(n, k, generator=g)
    full = K.matmul_f32(x, w)
    check_close(full, x.double().numpy() @ w.double().numpy().T)
    for lo, hi in [(0, 1), (11, 12), (2, 5), (4, 40), (33, 40)]:
        assert torch.equal(K.matmul_f32(x[lo:hi].contiguous(), w), full[lo:hi])


def test_isa_is_a_real_switch(runnable_isas):
    """The two builds are distinct code: their (each invariant) bits differ somewhere, and an
    unknown or unsupported ISA is refused by name."""
    with pytest.raises(RuntimeError, match="unknown ISA 'sse9'"):
        K.set_isa("sse9")
    with pytest.raises(RuntimeError, match="unknown ISA 'sse9'"):
        K.override_isa_unchecked("sse9")
    if len(runnable_isas) < 2:
        pytest.skip("only one ISA runs on this CPU")
    n, k = 64, 512
    w = torch.from_numpy(random_quant("Q4_1", n, k, seed=11))
    x = torch.randn(8, k, generator=torch.Generator().manual_seed(12))
    before, outs = K.isa(), {}
    try:
        for name in runnable_isas:
            K.override_isa_unchecked(name)
            outs[name] = K.qmatmul(x, w, QTYPES["Q4_1"], n, k)
    finally:
        K.override_isa_unchecked(before)
    assert not torch.equal(outs["avx2"], outs["avx512"])
    torch.testing.assert_close(outs["avx2"], outs["avx512"], rtol=1e-5, atol=1e-5)


def test_qmatmul_rejects_bad_shapes():
    w = torch.zeros(4, row_bytes(3, 64), dtype=torch.uint8)
    with pytest.raises(RuntimeError, match="expected n\\*row_bytes"):
        K.qmatmul(torch.zeros(1, 64), w, 3, 5, 64)
    with pytest.raises(RuntimeError, match="unsupported qtype 99"):
        K.qmatmul(torch.zeros(1, 64), w, 99, 4, 64)
    with pytest.raises(RuntimeError, match="multiple of 32"):
        K.qmatmul(torch.zeros(1, 48), w, 3, 4, 48)


# ---------------------------------------------------------------- paged attention


class PagedCache:
    """Random K/V for several sequences scattered over shuffled blocks of a shared pool."""

    def __init__(self, seq_lens, kvh, hd, block_size, seed):
        g = torch.Generator().manual_seed(seed)
        self.block_size = block_size
        per_seq = [-(-n // block_size) for n in seq_lens]
        num_blocks = sum(per_seq) + 3  # a few unused blocks
        self.k = torch.randn(num_blocks, block_size, kvh, hd, generator=g)
        self.v = torch.randn(num_blocks, block_size, kvh, hd, generator=g)
        ids = torch.randperm(num_blocks, generator=g)
        self.tables = torch.full((len(seq_lens), max(per_seq) + 1), -1, dtype=torch.int32)
        at = 0
        for s, nb in enumerate(per_seq):
            self.tables[s, :nb] = ids[at : at + nb].to(torch.int32)
            at += nb

    def run(self, q, rows, scale, window=0, softcap=0.0, k=None):
        seq = torch.tensor([s for s, _ in rows], dtype=torch.int32)
        pos = torch.tensor([p for _, p in rows], dtype=torch.int32)
        return K.paged_attention(q, self.k if k is None else k, self.v, self.tables, seq, pos, scale, window, softcap)

    def reference(self, q, rows, scale, window=0, softcap=0.0):
        """float64 numpy oracle, written from the spec, not from the kernel."""
        kc, vc, tab = self.k.double().numpy(), self.v.double().numpy(), self.tables.numpy()
        qn = q.double().numpy()
        n, h, hd = qn.shape
        group = h // kc.shape[2]
        out = np.zeros_like(qn)
        for i, (s, pos) in enumerate(rows):
            start = max(0, pos - window + 1) if window else 0
            ps = np.arange(start, pos + 1)
            blocks, offs = tab[s][ps // self.block_size], ps % self.block_size
            for head in range(h):
                keys, vals = kc[blocks, offs, head // group], vc[blocks, offs, head // group]
                sc = keys @ qn[i, head] * scale
                if softcap:
                    sc = softcap * np.tanh(sc / softcap)
                e = np.exp(sc - sc.max())
                out[i, head] = e @ vals / e.sum()
        return out


ATTN_SHAPES = [  # (h, kvh, hd, block_size, window, softcap)
    (9, 3, 64, 16, 0, 0.0),
    (4, 1, 32, 7, 0, 0.0),
    (4, 2, 20, 5, 0, 0.0),  # head_dim not a multiple of 8: masked tail lanes
    (9, 3, 64, 3, 11, 0.0),
    (4, 1, 32, 13, 0, 30.0),
    (2, 2, 64, 1, 6, 50.0),
]


# |out - ref| <= 1e-5 * max|V|: the output is a convex combination of V rows; f32 scores carry
# ~hd * 2^-24 relative error (~1e-6 at hd=64 for unit-variance q, k), exp is ~1 ulp, so the
# weights are off by ~1e-6 relative and the output by ~1e-6 of max|V| — a 10x margin.
ATTN_TOL = 1e-5


@pytest.mark.parametrize("h,kvh,hd,bs,window,softcap", ATTN_SHAPES)
def test_paged_attention_matches_float64_oracle(h, kvh, hd, bs, window, softcap, isa):
    cache = PagedCache([37, 5, 20], kvh, hd, bs, seed=hd + bs)
    rows = [(0, p) for p in (0, 1, 8, 36)] + [(1, 4), (2, 0), (2, 19)]
    q = torch.randn(len(rows), h, hd, generator=torch.Generator().manual_seed(1))
    scale = hd**-0.5
    ours = cache.run(q, rows, scale, window, softcap).double().numpy()
    ref = cache.reference(q, rows, scale, window, softcap)
    assert np.abs(ours - ref).max() <= ATTN_TOL * cache.v.abs().max().item()


def invariance_setup(h=9, kvh=3, hd=64, bs=5, seed=11):
    cache = PagedCache([41, 17, 29], kvh, hd, bs, seed=seed)
    q_all = torch.randn(41, h, hd, generator=torch.Generator().manual_seed(seed))  # seq 0's rows
    other = [(1, p) for p in range(17)] + [(2, p) for p in range(29)]
    q_other = torch.randn(len(other), h, hd, generator=torch.Generator().manual_seed(seed + 1))
    return cache, q_all, other, q_other


@pytest.mark.parametrize("window,softcap", [(0, 0.0), (9, 0.0), (0, 20.0)])
def test_paged_attention_is_batch_invariant(window, softcap, threads, isa):
    """Decode (one row), chunked prefill at random split points, and mixed batches with
    unrelated sequences all give the very same bits for each row of sequence 0."""
    cache, q_all, other, q_other = invariance_setup()
    scale = 0.125
    rows = [(0, p) for p in range(41)]
    full = cache.run(q_all, rows, scale, window, softcap)

    decode = torch.cat(
        [cache.run(q_all[p : p + 1].contiguous(), rows[p : p + 1], scale, window, softcap) for p in range(41)]
    )
    assert torch.equal(decode, full)

    rng = np.random.default_rng(threads)
    for _ in range(3):
        cuts = [0, *sorted(rng.choice(np.arange(1, 41), size=4, replace=False).tolist()), 41]
        chunked = torch.cat(
            [cache.run(q_all[a:b].contiguous(), rows[a:b], scale, window, softcap) for a, b in zip(cuts, cuts[1:])]
        )
        assert torch.equal(chunked, full), cuts

    mixed_rows = rows + other
    order = rng.permutation(len(mixed_rows))
    q_mixed = torch.cat([q_all, q_other])[order].contiguous()
    mixed = cache.run(q_mixed, [mixed_rows[i] for i in order], scale, window, softcap)
    back = torch.empty_like(mixed)
    back[torch.from_numpy(order)] = mixed
    assert torch.equal(back[:41], full)


@pytest.mark.parametrize("h,kvh", [(4, 1), (8, 1), (2, 2)])
def test_paged_attention_head_grouping_does_not_change_bits(h, kvh, threads, isa):
    """Query heads are scored in runs that share K loads (4 heads of one kv head: 2 + 2);
    a decode row and the same row in a prefill of 41 rows give the same bits per head."""
    cache, q_all, _, _ = invariance_setup(h=h, kvh=kvh, seed=14)
    rows = [(0, p) for p in range(41)]
    full = cache.run(q_all, rows, 0.125)
    decode = torch.cat([cache.run(q_all[p : p + 1].contiguous(), rows[p : p + 1], 0.125) for p in range(41)])
    assert torch.equal(decode, full)
    seq, pos = torch.zeros(41, dtype=torch.int32), torch.arange(41, dtype=torch.int32)
    for head in range(h):  # one head alone (its kv head only) equals itself inside its run
        kv = slice(head // (h // kvh), head // (h // kvh) + 1)
        one = K.paged_attention(
            q_all[:, head : head + 1].contiguous(),
            cache.k[:, :, kv].contiguous(),
            cache.v[:, :, kv].contiguous(),
            cache.tables,
            seq,
            pos,
            0.125,
        )
        assert torch.equal(one[:, 0], full[:, head])


def test_paged_attention_bits_do_not_depend_on_thread_count(isa):
    cache, q_all, _, _ = invariance_setup(seed=12)
    rows = [(0, p) for p in range(41)]
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = cache.run(q_all, rows, 0.125)
        torch.set_num_threads(2)
        two = cache.run(q_all, rows, 0.125)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(one, two)


def test_paged_attention_invariance_control_can_fail(isa):
    """Perturbing one attended K value slightly (1e-3) must change the row's bits: the
    equality checks above are sensitive enough to catch a real difference. (A one-ulp change
    can vanish in the rounding of the score, so it would not make a reliable control.)"""
    cache, q_all, _, _ = invariance_setup(seed=13)
    rows = [(0, 30)]
    q = q_all[30:31].contiguous()
    base = cache.run(q, rows, 0.125)
    k2 = cache.k.clone()
    block, off = int(cache.tables[0, 12 // cache.block_size]), 12 % cache.block_size
    k2[block, off, 0, 3] += 1e-3
    assert not torch.equal(cache.run(q, rows, 0.125, k=k2)[:, :3], base[:, :3])


def test_paged_attention_rejects_out_of_range_positions():
    cache = PagedCache([10], 1, 8, 4, seed=0)
    q = torch.zeros(1, 1, 8)
    with pytest.raises(RuntimeError, match="row_pos"):
        cache.run(q, [(0, 10_000)], 1.0)
    with pytest.raises(RuntimeError, match="row_seq"):
        cache.run(q, [(3, 0)], 1.0)


# ---------------------------------------------------------------- loader


def test_missing_compiler_is_a_reason_not_a_crash(monkeypatch):
    monkeypatch.setenv("CXX", "no-such-compiler-agentkv")
    assert "no C++ compiler" in unavailable_reason()


def test_load_is_cached():
    assert load() is K


def test_row_bytes_rejects_bad_input():
    assert row_bytes(3, 576) == 18 * 20
    with pytest.raises(ValueError, match="multiple of 256"):
        row_bytes(12, 576)
    with pytest.raises(ValueError, match="not supported"):
        row_bytes(16, 64)  # IQ2_XXS: no kernel


def test_avx512_objects_export_no_inline_code():
    """Code built for AVX-512 must stay private to its object file: a weak (COMDAT) symbol
    there could be picked by the linker for the AVX2 callers and crash an AVX2-only CPU."""
    import shutil
    import subprocess

    from agentkv.hal.kernels import build_directory

    if shutil.which("nm") is None:
        pytest.skip("no nm on PATH")
    for name in ("qmatmul512.o", "qmatmul_vnni.o", "attention512.o"):
        obj = build_directory() / name
        assert obj.exists(), obj
        symbols = subprocess.run(["nm", "-C", str(obj)], capture_output=True, text=True, check=True).stdout
        weak = [line for line in symbols.splitlines() if len(line.split()) >= 3 and line.split()[1] in "WVu"]
        assert not weak, f"{name} exports inline code: {weak}"

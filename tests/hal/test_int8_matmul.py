"""The int8-activation matmul (qmatmul int8=True; AVX-512 VNNI, and AVX2 where that build runs):
its values against a float64 oracle of the same rounding, its batch and thread invariance, the
two builds' equal bits, and the qtypes it leaves to f32."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch

from tests.hal.test_kernels import LEGACY, QTYPES, K, gguf_dequant, random_quant

INT8 = ["Q4_0", "Q4_1", "Q5_0", "Q8_0", "Q4_0X", "Q4_1X", "Q5_0X", "Q8_0X", "MXFP4X", "Q4_K", "Q6_K", "MXFP4"]
MXFP4 = int(gguf.GGMLQuantizationType.MXFP4)
# rows interleaved at load for the int8 kernels (qmatmul_vnni.h), by their file's format
INTERLEAVED = {
    "Q4_0X": ("Q4_0", 2002),
    "Q4_1X": ("Q4_1", 2003),
    "Q5_0X": ("Q5_0", 2006),
    "Q8_0X": ("Q8_0", 2008),
    "MXFP4X": ("MXFP4", 2039),
}
# 32-weight blocks (an odd k / 32 tests the unpaired last block; interleaved, k = 544 is one
# full group of 16 blocks and a one-block last group, k = 256 a short group alone)
BLOCK_32 = LEGACY | {"MXFP4"} | set(INTERLEAVED)


def weights(name: str, n: int, k: int, seed: int) -> tuple[np.ndarray, int, np.ndarray]:
    """Random blocks of `name` [n, k], its gguf type, and gguf-py's values of them (f64)."""
    if name == "MXFP4":
        from tests.hal.test_mxfp4_kernels import random_blocks

        raw = random_blocks(n, k, seed, scales=(112, 136))
        return raw, MXFP4, gguf.quants.dequantize(raw, MXFP4).astype(np.float64)
    if name in INTERLEAVED:
        file, qtype = INTERLEAVED[name]
        raw, file_qtype, values = weights(file, n, k, seed)
        return K.interleave_rows(torch.from_numpy(raw), file_qtype, n, k).numpy(), qtype, values
    raw = random_quant(name, n, k, seed)
    return raw, QTYPES[name], gguf_dequant(raw, name).astype(np.float64)


def quantized_activations(x: np.ndarray, block: int = 32) -> np.ndarray:
    """x rounded as the kernel rounds it: per row and `block`-wide block (32; 256 for the
    K-quants, as llama.cpp's q8_K), d = max|x| / 127 (f32), codes = round-half-even(x * (1 / d)),
    returned as codes * d in float64."""
    m, k = x.shape
    blocks = x.astype(np.float32).reshape(m, k // block, block)
    d = (np.abs(blocks).max(axis=2, keepdims=True) / np.float32(127)).astype(np.float32)
    inv = np.where(d != 0, np.float32(1) / np.where(d != 0, d, 1), 0).astype(np.float32)
    codes = np.clip(np.rint((blocks * inv).astype(np.float32)), -127, 127)
    return (codes.astype(np.float64) * d.astype(np.float64)).reshape(m, k)


def check_matches(ours: torch.Tensor, ref: np.ndarray):
    """f32 sums of exact integer dot products: within 2e-5 of the largest |output|."""
    got = ours.double().numpy()
    assert np.abs(got - ref).max() <= 2e-5 * np.abs(ref).max()


@pytest.mark.parametrize("name", INT8)
@pytest.mark.parametrize("m", [1, 3, 8, 13, 70])
def test_int8_matches_the_oracle_of_its_rounding(name, m, isa):
    """32-weight formats at k = 544 (17 blocks: an odd last block), K-quants at 512."""
    n, k = 45, 544 if name in BLOCK_32 else 512
    w, qtype, values = weights(name, n, k, seed=2)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(3))
    x[0, :32] = 0.0  # an all-zero block (d = 0)
    ref = quantized_activations(x.numpy(), 32 if name in BLOCK_32 else 256) @ values.T
    check_matches(K.qmatmul(x, torch.from_numpy(w), qtype, n, k, int8=True), ref)


@pytest.mark.parametrize("name", INT8)
def test_int8_rows_are_batch_and_thread_invariant(name, threads, isa):
    """Slices of 1..3 rows run the decode kernels; 4 or more (the AVX2 build: 5 or more), the
    interleaved formats' packed tiles (k = 896: a full group of 16 blocks and a 12-block last
    one; k = 256 for the other 32-weight formats, a short group alone): the same bits either
    way."""
    n, k = 61, 896 if name in INTERLEAVED else 256 if name in BLOCK_32 else 512
    raw, qtype, _ = weights(name, n, k, seed=4)
    w = torch.from_numpy(raw)
    x = torch.randn(150, k, generator=torch.Generator().manual_seed(5))
    full = K.qmatmul(x, w, qtype, n, k, int8=True)
    for lo, hi in [(0, 1), (9, 10), (0, 2), (5, 8), (8, 12), (30, 35), (3, 12), (20, 27), (1, 64), (70, 150), (63, 66)]:
        assert torch.equal(K.qmatmul(x[lo:hi].contiguous(), w, qtype, n, k, int8=True), full[lo:hi]), (lo, hi)
    perm = torch.randperm(150, generator=torch.Generator().manual_seed(6))
    assert torch.equal(K.qmatmul(x[perm].contiguous(), w, qtype, n, k, int8=True), full[perm])


@pytest.mark.parametrize("name", INT8)
def test_the_avx2_build_has_the_vnni_builds_bits(name, runnable_isas):
    """qmatmul_int8.cpp (AVX2: vpmaddubsw + vpmaddwd) against qmatmul_vnni.cpp (vpdpbusd), every
    format, decode and prefill row counts, an all-zero block and an odd last block: equal bits.
    Control: the two f32 builds, each invariant, do differ on the same inputs, so the comparison
    is of two real computations that could disagree."""
    if "avx512" not in runnable_isas:
        pytest.skip("this CPU has no AVX-512: only the AVX2 build runs here")
    before = K.isa()
    try:
        K.override_isa_unchecked("avx512")
        if K.int8_build() != "avx512-vnni":
            pytest.skip("this CPU has AVX-512 without VNNI: both ISAs run the AVX2 int8 build")
        n, k = 45, 544 if name in BLOCK_32 else 512
        raw, qtype, _ = weights(name, n, k, seed=21)
        w = torch.from_numpy(raw)
        x = torch.randn(70, k, generator=torch.Generator().manual_seed(22))
        x[0, :32] = 0.0
        runs = {}
        for isa_name in ("avx512", "avx2"):
            K.override_isa_unchecked(isa_name)
            runs[isa_name] = [K.qmatmul(x[:m].contiguous(), w, qtype, n, k, int8=True) for m in (1, 2, 3, 5, 8, 13, 70)]
            if name in INTERLEAVED:  # f32 kernels do not read interleaved rows: the control uses the file's
                plain, file_qtype, _ = weights(INTERLEAVED[name][0], n, k, seed=21)
                runs[isa_name + "-f32"] = K.qmatmul(x, torch.from_numpy(plain), file_qtype, n, k)
            else:
                runs[isa_name + "-f32"] = K.qmatmul(x, w, qtype, n, k)
    finally:
        K.override_isa_unchecked(before)
    for vnni, avx2 in zip(runs["avx512"], runs["avx2"]):
        assert torch.equal(vnni, avx2)
    assert not torch.equal(runs["avx512-f32"], runs["avx2-f32"])


def test_int8_is_its_own_arithmetic_and_the_comparisons_can_fail():
    """Controls: int8 results are not the f32 path's bits (the mode is real), and one changed
    input bit in a row shows in that row's int8 output."""
    name, n, k = "Q4_1", 16, 256
    w = torch.from_numpy(random_quant(name, n, k, seed=7))
    x = torch.randn(8, k, generator=torch.Generator().manual_seed(8))
    full = K.qmatmul(x, w, QTYPES[name], n, k, int8=True)
    assert not torch.equal(full, K.qmatmul(x, w, QTYPES[name], n, k))
    x2 = x.clone()
    x2[3, 17] *= 1.5
    assert not torch.equal(K.qmatmul(x2[3:4].contiguous(), w, QTYPES[name], n, k, int8=True), full[3:4])


@pytest.mark.parametrize("name", ["Q5_1", "Q5_K"])
def test_qtypes_without_an_int8_kernel_take_the_f32_path(name):
    assert not K.int8_qtype_supported(QTYPES[name])
    n, k = 20, 256
    w = torch.from_numpy(random_quant(name, n, k, seed=11))
    x = torch.randn(5, k, generator=torch.Generator().manual_seed(12))
    assert torch.equal(K.qmatmul(x, w, QTYPES[name], n, k, int8=True), K.qmatmul(x, w, QTYPES[name], n, k))


def test_the_witness_floor_passes_int8_and_fails_coarser_rounding():
    """COSINE_FLOOR_INT8 against f32 activations: the int8 kernels pass it; activations rounded
    to 4 bits per block the same way (an int4 kernel's rounding) fail it, so it can fail."""
    from agentkv.witness.ops import COSINE_FLOOR_INT8, cosine

    n, k = 96, 256
    w = random_quant("Q4_0", n, k, seed=15)
    x = torch.randn(19, k, generator=torch.Generator().manual_seed(16))
    weights = gguf_dequant(w, "Q4_0").astype(np.float64)
    ref = x.double().numpy() @ weights.T
    assert cosine(ref, K.qmatmul(x, torch.from_numpy(w), 2, n, k, int8=True).numpy()) >= COSINE_FLOOR_INT8
    blocks = x.numpy().reshape(19, k // 32, 32)
    d = np.abs(blocks).max(axis=2, keepdims=True) / 7
    coarse = (np.clip(np.rint(blocks / d), -7, 7) * d).reshape(19, k)
    assert cosine(ref, coarse @ weights.T) < COSINE_FLOOR_INT8


@pytest.mark.parametrize("name", sorted(INTERLEAVED))
@pytest.mark.parametrize("k", [32, 256, 512, 544, 1600])
def test_interleaved_rows_keep_their_values_and_refuse_f32(name, k, isa):
    """An interleaved form holds its file format's bytes per row, rearranged: dequantized it is
    the file's bit for bit (so an interleaved embedding table reads the same), its int8 matmul
    meets the oracle of the 32-wide rounding at every group shape (k / 32 = 1, 8, 16, 17 and 50
    blocks), and the f32 path, which reads the file's order, refuses it rather than read it
    wrongly."""
    n, (file, qtype) = 19, INTERLEAVED[name]
    raw, file_qtype, values = weights(file, n, k, seed=k)
    w = K.interleave_rows(torch.from_numpy(raw), file_qtype, n, k)
    assert w.shape == (n, raw.shape[1]) and (k == 32 or not torch.equal(w, torch.from_numpy(raw)))
    assert torch.equal(K.dequantize(w, qtype, n, k), K.dequantize(torch.from_numpy(raw), file_qtype, n, k))
    x = torch.randn(9, k, generator=torch.Generator().manual_seed(k + 1))
    ref = quantized_activations(x.numpy()) @ values.T
    check_matches(K.qmatmul(x, w, qtype, n, k, int8=True), ref)
    with pytest.raises(ValueError, match="need int8 activations"):
        K.qmatmul(x, w, qtype, n, k)


def test_only_the_32_wide_formats_with_an_interleaved_kernel_are_interleaved():
    raw = random_quant("Q5_1", 4, 64, seed=1)
    with pytest.raises(RuntimeError, match="qtype 7 has no interleaved form"):
        K.interleave_rows(torch.from_numpy(raw), QTYPES["Q5_1"], 4, 64)


# the code bytes of a 4-bit file format's block, and the byte that gives every code its largest
# u8 value in the int8 kernels (MXFP4: nibble 7, 6.0, doubled plus 12 = 24; Q5_0: its fifth
# bits in qh set too)
LARGEST_CODES = {
    "Q4_0": ((2, 18), 0xFF),
    "Q4_1": ((4, 20), 0xFF),
    "Q5_0": ((2, 22), 0xFF),
    "MXFP4": ((1, 17), 0x77),
}


@pytest.mark.parametrize("name", sorted(LARGEST_CODES))
def test_int8_sums_at_their_largest_stay_exact(name, isa):
    """Every weight code at its largest and every activation code at 127: the AVX2 build adds
    the pair sums of up to 8 steps in int16 (Interleaved::STEPS16), and here each partial sum
    is at its bound (Q4_0/Q4_1 8 x 3,810, Q5_0 4 x 7,874, MXFP4 4 x 6,096). Tiled (13 rows)
    and decode (1 row) results against the float64 oracle of the same rounding, and equal."""
    n, k = 24, 544
    file, qtype = INTERLEAVED[name + "X"]
    raw, file_qtype, _ = weights(file, n, k, seed=31)
    (lo, hi), byte = LARGEST_CODES[name]
    blocks = raw.reshape(-1, raw.shape[1] * 32 // k)
    blocks[:, lo:hi] = byte
    values = (gguf.quants.dequantize(raw, file_qtype)).astype(np.float64)
    w = K.interleave_rows(torch.from_numpy(raw), file_qtype, n, k)
    x = torch.ones(13, k)
    ref = quantized_activations(x.numpy()) @ values.T
    tiled = K.qmatmul(x, w, qtype, n, k, int8=True)
    check_matches(tiled, ref)
    assert torch.equal(K.qmatmul(x[:1].contiguous(), w, qtype, n, k, int8=True), tiled[:1])
